#!/usr/bin/env bash
# Deploys inferd to Azure Container Instances. Documented, not run by the tests: it needs an Azure subscription and
# `az login`. The image is built in the cloud by ACR Tasks, so no local Docker engine is needed.
#
#   aci/deploy.sh                 # inferd alone, public on :8080 (and gRPC on :8001)
#   aci/deploy.sh gateway         # behind the nginx gateway sidecar, public on :80 (and inferd's gRPC on :8001)
set -euo pipefail
cd "$(dirname "$0")/.."

RESOURCE_GROUP=${RESOURCE_GROUP:-inferd-rg}
LOCATION=${LOCATION:-eastus}
REGISTRY=${REGISTRY:-inferdregistry}
VARIANT=${1:-single}

az group create --name "$RESOURCE_GROUP" --location "$LOCATION"
az acr create --resource-group "$RESOURCE_GROUP" --name "$REGISTRY" --sku Standard --admin-enabled true
# ACI's GPUs are K80/P100/V100: the V100 build is CUDA 12 for sm_70, with ONNX Runtime on the CPU (docs/deploy.md).
az acr build --registry "$REGISTRY" --image inferd:cuda12-sm70 --file docker/Dockerfile.cuda \
    --build-arg CUDA_VERSION=12.8.1 --build-arg CUDA_COMPUTE_CAP=70 --build-arg ONNXRUNTIME_PACKAGE=onnxruntime .

PASSWORD=$(az acr credential show --name "$REGISTRY" --query 'passwords[0].value' --output tsv)
if [ "$VARIANT" = gateway ]; then FILE=aci/inferd-gpu-gateway.yaml; PORT=80; else FILE=aci/inferd-gpu.yaml; PORT=8080; fi
API_KEY=${INFERD_API_KEY:-$(openssl rand -hex 24)}
# The YAML holds placeholders for the two secrets; fill them in a temporary copy that never lands on disk for long.
RENDERED=$(mktemp)
trap 'rm -f "$RENDERED"' EXIT
sed -e "s|<registry password: az acr credential show --name inferdregistry>|$PASSWORD|" \
    -e "s|<replace with a long random key>|$API_KEY|" \
    -e "s|inferdregistry|$REGISTRY|g" -e "s|location: eastus|location: $LOCATION|" "$FILE" > "$RENDERED"
az container create --resource-group "$RESOURCE_GROUP" --file "$RENDERED"

FQDN=$(az container show --resource-group "$RESOURCE_GROUP" --name "$(awk '/^name:/ {print $2}' "$FILE")" \
    --query ipAddress.fqdn --output tsv)
echo "Waiting for http://$FQDN:$PORT/health/ready"
until curl -fsS "http://$FQDN:$PORT/health/ready"; do sleep 10; done
echo
curl -fsS "http://$FQDN:$PORT/health" && echo
echo "gRPC (KServe v2 / Triton, tritonclient.grpc): $FQDN:8001"
echo "API key (single variant): $API_KEY"
