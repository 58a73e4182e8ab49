//! The OpenAPI document's frame: title, the bearer-key scheme, tags. The paths and schemas come from the
//! handlers' `#[utoipa::path]` attributes and the served wire types, registered with the router.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "inferd",
        description = "GPU inference server: `/predict`, the KServe v2 / Open Inference Protocol (with Triton's \
                       binary tensor extension), health probes and Prometheus metrics."
    ),
    modifiers(&BearerKey),
    // Named only inside a route's error answers (which the routes' own registration does not reach).
    components(schemas(crate::routes::dispatch::SharedError)),
    tags(
        (name = "inference", description = "Predictions, batched dynamically per model"),
        (name = "kserve-v2", description = "KServe v2 / Open Inference Protocol"),
        (name = "shared-memory", description = "Triton's shared-memory extension: tensors in regions a client on the same host registered"),
        (name = "health", description = "Probes for orchestrators; never need a key"),
        (name = "metrics", description = "Prometheus"),
    )
)]
pub struct ApiDoc;

/// Declares the `api_key` scheme the protected routes name: `Authorization: Bearer <key>`.
struct BearerKey;

impl Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("Needed when the server runs with --api-key or --api-key-file"))
                    .build(),
            ),
        );
    }
}
