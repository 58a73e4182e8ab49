//! The gate's pure parts: which RPCs are probes, and how `grpc-timeout` reads; and the drain's GOAWAY, spoken to
//! frame by frame; and which service an RPC reaches, and what its answer's headers hold.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::connections::ConnectionSettings;

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

/// One HTTP/2 frame: its type, flags, stream and payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

const HEADERS: u8 = 1;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const END_STREAM: u8 = 1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("small").to_be_bytes();
    [&len[1..], &[kind, flags], &stream.to_be_bytes(), payload].concat()
}

async fn read_frame(socket: &mut TcpStream) -> Option<Frame> {
    let mut head = [0u8; 9];
    socket.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0; len];
    socket.read_exact(&mut payload).await.ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some(Frame { kind: head[3], flags: head[4], stream, payload })
}

/// A `ModelStreamInfer` request's headers on `stream`, each an HPACK literal without indexing: the stream stays
/// open, sending nothing.
fn open_stream(stream: u32) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.extend([0, name.len() as u8]);
        block.extend(name.as_bytes());
        block.push(value.len() as u8);
        block.extend(value.as_bytes());
    }
    frame(HEADERS, 0x4, stream, &block)
}

/// The gRPC listener on a loopback port, serving a repository of the echo model, in a task of its own.
struct Served {
    address: std::net::SocketAddr,
    drain: Arc<Drain>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// The repository's folder, removed when the test ends.
    _repository: tempfile::TempDir,
}

async fn serve_echo() -> Served {
    let repository = tempfile::tempdir().expect("tempdir");
    crate::testing::model_folder(repository.path(), "echo", "");
    let state = crate::testing::loaded_state(repository.path(), &[]);
    let drain = state.drain().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let second = Duration::from_secs(1);
    let settings = ConnectionSettings { max_connections: 4, header_read_timeout: second, idle_timeout: second };
    let server = tokio::spawn(serve(vec![listener.into()], app(state), settings, drain.clone()));
    Served { address, drain, server, _repository: repository }
}

/// A client that had a stream's HEADERS and a WINDOW_UPDATE for it queued behind its answer to the drain's PING
/// sends them after the GOAWAY that ends at the stream before: both are ignored, and the stream before is served
/// to its end, where h2 took the window update for a frame on an idle stream and ended the connection with
/// PROTOCOL_ERROR, every stream on it with it (vendor/README.md).
#[tokio::test]
async fn frames_on_a_stream_past_the_drains_goaway_are_ignored() {
    let Served { address, drain, server, _repository } = serve_echo().await;

    let mut socket = TcpStream::connect(address).await.expect("connect");
    let hello = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".as_slice(), &frame(4, 0, 0, &[])].concat();
    socket.write_all(&[hello, open_stream(1)].concat()).await.expect("send");
    tokio::spawn(drain.clone().until_closing(async {}, || {}));
    // The drain's GOAWAY (every stream), and a PING whose answer asks for the second GOAWAY.
    let mut seen = Vec::new();
    let ask = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let f = read_frame(&mut socket).await.expect("the connection stays open");
            if f.kind == PING && f.flags == 0 {
                break f.payload;
            }
            seen.push(f);
        }
    });
    let ping = ask.await.expect("the drain pings");
    assert!(seen.iter().any(|f| f.kind == GOAWAY), "no GOAWAY before the drain's PING");
    socket.write_all(&frame(PING, 1, 0, &ping)).await.expect("answer the PING");
    let last = loop {
        let f = read_frame(&mut socket).await.expect("the second GOAWAY");
        if f.kind == GOAWAY {
            break f;
        }
    };
    assert_eq!((&last.payload[..4], &last.payload[4..8]), (&1u32.to_be_bytes()[..], &[0; 4][..]), "GOAWAY(1)");
    // Stream 3 was opened too late: its HEADERS and window update are to be dropped.
    let late = [open_stream(3), frame(8, 0, 3, &5u32.to_be_bytes())].concat();
    socket.write_all(&late).await.expect("send");

    let mut ending = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(f) = read_frame(&mut socket).await {
            ending.push(f);
        }
    });
    read.await.expect("the connection closes once stream 1 ends");
    let errors: Vec<u32> = ending
        .iter()
        .filter(|f| f.kind == GOAWAY)
        .map(|f| u32::from_be_bytes([f.payload[4], f.payload[5], f.payload[6], f.payload[7]]))
        .collect();
    assert_eq!(errors, [0u32; 0], "the connection ended with an error");
    let trailers = ending.iter().any(|f| f.kind == HEADERS && f.stream == 1 && f.flags & END_STREAM != 0);
    assert!(trailers, "stream 1 was not served to its end");
    assert!(ending.iter().all(|f| f.stream != 3), "stream 3 was answered");
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("the server ends").expect("task").expect("ok");
}

/// An HTTP/2 connection to `address`, driven in a task of its own: what sends its requests.
async fn connect<B>(address: std::net::SocketAddr) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let socket = TcpStream::connect(address).await.expect("connect");
    let (sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(socket))
            .await
            .expect("an HTTP/2 connection");
    tokio::spawn(connection);
    sender
}

/// An empty unary call to `path` over `sender`: the answer's status, headers and `grpc-status` trailer.
async fn call_empty(
    sender: &mut hyper::client::conn::http2::SendRequest<http_body_util::Full<Bytes>>,
    address: std::net::SocketAddr,
    path: &str,
) -> (u16, HeaderMap, Option<String>) {
    use http_body_util::BodyExt;

    let request = axum::http::Request::post(format!("http://{address}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .expect("a request");
    let answer = sender.send_request(request).await.expect("an answer");
    let (status, headers) = (answer.status().as_u16(), answer.headers().clone());
    let body = answer.into_body().collect().await.expect("the answer's body");
    // A refusal made before the body carries its status in its headers (a trailers-only answer).
    let trailer = body.trailers().and_then(|t| t.get("grpc-status")).or(headers.get("grpc-status"));
    let code = trailer.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    (status, headers, code)
}

/// A gRPC answer's headers are its content type and request id: no `date`, which gRPC's clients do not read (and
/// gRPC's own servers do not send). Each RPC reaches the service its path names, and a path that names no service
/// or method of theirs is UNIMPLEMENTED (12).
#[tokio::test]
async fn rpcs_reach_their_service_and_answers_carry_no_date() {
    let Served { address, .. } = serve_echo().await;

    let mut sender = connect(address).await;
    let (status, headers, code) = call_empty(&mut sender, address, "/inference.GRPCInferenceService/ServerLive").await;
    assert_eq!(status, 200);
    assert_eq!(headers.get("content-type").map(|v| v.as_bytes()), Some(&b"application/grpc"[..]), "{headers:?}");
    assert!(headers.contains_key("x-request-id"), "{headers:?}");
    assert!(!headers.contains_key("date"), "{headers:?}");
    assert_eq!(code.as_deref(), Some("0"), "ServerLive");
    // The health service's Check, for the whole server (an empty request names no service).
    let (_, _, code) = call_empty(&mut sender, address, "/grpc.health.v1.Health/Check").await;
    assert_eq!(code.as_deref(), Some("0"), "Health/Check");
    for path in [
        "/inference.GRPCInferenceService/NoSuchMethod",
        "/grpc.health.v1.Health/NoSuchMethod",
        "/no.such.Service/ServerLive",
        "/inference.GRPCInferenceServiceX/ServerLive",
        "/inference.GRPCInferenceService",
    ] {
        let (status, _, code) = call_empty(&mut sender, address, path).await;
        assert_eq!((status, code.as_deref()), (200, Some("12")), "{path}");
    }
}

type Chunks = http_body_util::StreamBody<
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<hyper::body::Frame<Bytes>, Infallible>> + Send>>,
>;

/// A unary call to `ModelInfer` over `sender`, its body `chunks` (each a data frame; left open when `open`), with
/// `headers` besides gRPC's own: the answer's headers, its body's bytes, and its `grpc-status` (in its trailers, or
/// in its headers for a trailers-only answer).
async fn call_infer(
    sender: &mut hyper::client::conn::http2::SendRequest<Chunks>,
    headers: &[(&str, &str)],
    chunks: Vec<Bytes>,
    open: bool,
) -> (HeaderMap, Bytes, Option<String>) {
    use futures_util::StreamExt;
    use http_body_util::BodyExt;

    let frames = futures_util::stream::iter(chunks).map(|c| Ok(hyper::body::Frame::data(c)));
    let frames: std::pin::Pin<Box<dyn futures_util::Stream<Item = _> + Send>> =
        if open { Box::pin(frames.chain(futures_util::stream::pending())) } else { Box::pin(frames) };
    let mut request = axum::http::Request::post("http://localhost/inference.GRPCInferenceService/ModelInfer")
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(http_body_util::StreamBody::new(frames)).expect("a request");
    let answer = sender.send_request(request).await.expect("an answer");
    let headers = answer.headers().clone();
    let body = answer.into_body().collect().await.expect("the answer's body");
    let trailer = body.trailers().and_then(|t| t.get("grpc-status")).or(headers.get("grpc-status"));
    let code = trailer.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    (headers, body.to_bytes(), code)
}

/// `ModelInfer` is read and answered past tonic's unary call (`unary`), over a real HTTP/2 connection: a message
/// whole or in pieces gets the echo model's answer, and each refusal is the status tonic's path gives it but for a
/// second message, INTERNAL here (a compressed call still goes to tonic's path, and is UNIMPLEMENTED); one past the
/// limit is answered while its body is open.
#[tokio::test]
async fn model_infer_answers_whole_or_in_pieces_and_refuses_bad_messages() {
    use prost::Message;

    use crate::codec::grpc::proto::model_infer_request::InferInputTensor;
    use crate::codec::grpc::proto::{ModelInferRequest, ModelInferResponse};

    let Served { address, .. } = serve_echo().await;
    let mut sender = connect(address).await;

    let row: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let input = InferInputTensor { name: "x".into(), datatype: "FP32".into(), shape: vec![1, 2], ..Default::default() };
    let message = ModelInferRequest {
        model_name: "echo".into(),
        id: "call-1".into(),
        inputs: vec![input],
        raw_input_contents: vec![Bytes::from(row.clone())],
        ..Default::default()
    }
    .encode_to_vec();
    let length = u32::try_from(message.len()).expect("small").to_be_bytes();
    let whole = Bytes::from([&[0u8][..], &length, &message].concat());

    for chunks in [vec![whole.clone()], vec![whole.slice(..3), whole.slice(3..9), whole.slice(9..)]] {
        let pieces = chunks.len();
        let (headers, body, code) = call_infer(&mut sender, &[], chunks, false).await;
        assert_eq!(code.as_deref(), Some("0"), "{pieces} pieces: {headers:?}");
        assert_eq!(headers.get("content-type").map(|v| v.as_bytes()), Some(&b"application/grpc"[..]));
        assert!(headers.contains_key("x-request-id"), "{headers:?}");
        assert_eq!(u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize, body.len() - 5);
        let answer = ModelInferResponse::decode(&body[5..]).expect("an answer");
        assert_eq!((answer.model_name.as_str(), answer.id.as_str()), ("echo", "call-1"));
        assert_eq!(answer.outputs.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["y"]);
        assert_eq!(answer.raw_output_contents, [Bytes::from(row.clone())], "{pieces} pieces");
    }

    // A model that is not there: the one error table's NOT_FOUND (5), in a trailers-only answer.
    let other = ModelInferRequest { model_name: "none".into(), ..Default::default() }.encode_to_vec();
    let other = Bytes::from([&[0u8, 0, 0, 0, u8::try_from(other.len()).expect("small")][..], &other].concat());
    let (headers, _, code) = call_infer(&mut sender, &[], vec![other], false).await;
    assert_eq!(code.as_deref(), Some("5"));
    assert!(headers.contains_key("grpc-status"), "not trailers-only: {headers:?}");
    // Compressed: tonic's path, which takes no compression (UNIMPLEMENTED, 12).
    let (_, _, code) = call_infer(&mut sender, &[("grpc-encoding", "gzip")], vec![whole.clone()], false).await;
    assert_eq!(code.as_deref(), Some("12"));
    // The compressed flag without an encoding, bytes that are no message, a second message: INTERNAL (13).
    let flagged = Bytes::from([&[1u8][..], &whole[1..]].concat());
    let garbage = Bytes::from_static(&[0, 0, 0, 0, 2, 0xff, 0xff]);
    let twice = Bytes::from([&whole[..], &whole[..]].concat());
    for (what, body) in [("flagged", flagged), ("garbage", garbage), ("twice", twice)] {
        let (_, _, code) = call_infer(&mut sender, &[], vec![body], false).await;
        assert_eq!(code.as_deref(), Some("13"), "{what}");
    }
    // Past --max-body-bytes (the default, 32 MiB, here): RESOURCE_EXHAUSTED (8) from the prefix, the body still open.
    let past = Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]);
    let call = call_infer(&mut sender, &[], vec![past], true);
    let (_, _, code) = tokio::time::timeout(Duration::from_secs(10), call).await.expect("answered before the body");
    assert_eq!(code.as_deref(), Some("8"));
}
