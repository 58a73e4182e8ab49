//! The gate's pure parts: which RPCs are probes, and how `grpc-timeout` reads.

use super::*;

#[test]
fn only_the_probes_are_open() {
    assert!(is_probe("/grpc.health.v1.Health/Check"));
    assert!(is_probe("/grpc.health.v1.Health/Watch"));
    assert!(is_probe("/inference.GRPCInferenceService/ServerLive"));
    assert!(is_probe("/inference.GRPCInferenceService/ServerReady"));
    assert!(!is_probe("/inference.GRPCInferenceService/ModelInfer"));
    assert!(!is_probe("/inference.GRPCInferenceService/ServerLiveX"));
    assert!(!is_probe("/other.Service/ServerLive"));
}

fn timeout(value: &str) -> Result<Option<Duration>, String> {
    let mut headers = HeaderMap::new();
    headers.insert("grpc-timeout", value.parse().expect("a header value"));
    grpc_timeout(&headers)
}

#[test]
fn grpc_timeouts_read_in_every_unit_and_bad_ones_are_named() {
    assert_eq!(grpc_timeout(&HeaderMap::new()), Ok(None));
    for (text, expected) in [
        ("1H", Duration::from_secs(3600)),
        ("2M", Duration::from_secs(120)),
        ("3S", Duration::from_secs(3)),
        ("250m", Duration::from_millis(250)),
        ("99999999u", Duration::from_micros(99_999_999)),
        ("7n", Duration::from_nanos(7)),
    ] {
        assert_eq!(timeout(text), Ok(Some(expected)), "{text}");
    }
    for bad in ["", "S", "123456789S", "10x", "-1S", "1.5S"] {
        let e = timeout(bad).expect_err(bad);
        assert!(e.contains("grpc-timeout"), "{e}");
    }
}

#[test]
fn a_message_over_the_limit_ends_as_resource_exhausted() {
    let status = stream_error(Status::out_of_range("decoded message length too large"), 1024);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("--max-body-bytes"), "{}", status.message());
    assert_eq!(stream_error(Status::cancelled("gone"), 1024).code(), tonic::Code::Cancelled);
}
