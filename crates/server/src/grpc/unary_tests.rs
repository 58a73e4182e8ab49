//! Reading a unary message from its body's chunks, and the answer's framing. The RPC itself, through a real HTTP/2
//! connection, is in `grpc::tests`.

use futures_util::StreamExt;

use super::*;

/// A body of `chunks`, each one data frame; then the end, or nothing ever more when `open`.
fn body(chunks: &[Bytes], open: bool) -> Body {
    let frames = futures_util::stream::iter(chunks.to_vec()).map(|c| Ok::<_, Infallible>(Frame::data(c)));
    if open {
        Body::new(http_body_util::StreamBody::new(frames.chain(futures_util::stream::pending())))
    } else {
        Body::new(http_body_util::StreamBody::new(frames))
    }
}

fn prefixed(flag: u8, message: &[u8]) -> Bytes {
    let length = u32::try_from(message.len()).expect("small").to_be_bytes();
    Bytes::from([&[flag][..], &length, message].concat())
}

async fn read(chunks: &[Bytes]) -> Result<Bytes, Status> {
    read_message(body(chunks, false), 1024).await
}

#[tokio::test]
async fn a_message_in_one_chunk_is_that_chunk_without_a_copy() {
    let whole = prefixed(0, b"hello");
    let message = read(std::slice::from_ref(&whole)).await.expect("read");
    assert_eq!(&message[..], b"hello");
    assert_eq!(message.as_ptr(), whole[PREFIX_BYTES..].as_ptr(), "the message was copied");
    // As many clients send it: the message, then an empty frame that ends the stream.
    let message = read(&[whole.clone(), Bytes::new()]).await.expect("read");
    assert_eq!(message.as_ptr(), whole[PREFIX_BYTES..].as_ptr(), "the message was copied");
}

#[tokio::test]
async fn a_message_in_pieces_is_joined_wherever_they_split() {
    let whole = prefixed(0, b"a message in pieces");
    for (a, b) in [(1, 3), (2, 5), (5, 6), (4, 20), (0, 24), (0, 0), (3, 3)] {
        let chunks = [whole.slice(..a), whole.slice(a..b), whole.slice(b..), Bytes::new()];
        let message = read(&chunks).await.unwrap_or_else(|e| panic!("{a}, {b}: {e}"));
        assert_eq!(&message[..], b"a message in pieces", "{a}, {b}");
    }
    // An empty message is one too.
    assert_eq!(read(&[prefixed(0, b"")]).await.expect("read"), Bytes::new());
}

#[tokio::test]
async fn a_body_that_is_not_one_whole_message_is_internal() {
    let cases: [(&[Bytes], &str); 5] = [
        (&[], "Missing request message."),
        (&[Bytes::from_static(&[0, 0, 0])], "Unexpected EOF decoding stream."),
        (&[Bytes::from_static(&[0, 0, 0, 0, 9, 1, 2])], "Unexpected EOF decoding stream."),
        (&[prefixed(1, b"zz")], "compressed-flag but no grpc-encoding"),
        (&[prefixed(7, b"zz")], "invalid compression flag: 7"),
    ];
    for (chunks, expected) in cases {
        let e = read(chunks).await.expect_err(expected);
        assert_eq!(e.code(), tonic::Code::Internal, "{expected}");
        assert!(e.message().contains(expected), "{}", e.message());
    }
    // A second message: tonic decoded it and dropped it; here it is refused, before its bytes are held.
    let two = [prefixed(0, b"one"), prefixed(0, b"two")];
    let e = read(&two).await.expect_err("two messages");
    assert!(e.code() == tonic::Code::Internal && e.message().contains("one message"), "{e}");
    // Past its message, in the same chunk.
    let e = read(&[Bytes::from([&prefixed(0, b"one")[..], &[0]].concat())]).await.expect_err("a byte more");
    assert_eq!(e.code(), tonic::Code::Internal);
}

/// A message longer than the limit is refused from its prefix: the body's rest is never waited for.
#[tokio::test]
async fn a_message_past_the_limit_is_refused_from_its_prefix() {
    let prefix = Bytes::from_static(&[0, 0, 0, 4, 1]);
    let read = read_message(body(&[prefix], true), 1024);
    let e = tokio::time::timeout(std::time::Duration::from_secs(5), read).await.expect("answered").expect_err("1025");
    assert_eq!(e.code(), tonic::Code::OutOfRange);
    assert!(e.message().contains("found 1025 bytes, the limit is: 1024 bytes"), "{}", e.message());
    // At the limit, it is read.
    let at = read_message(body(&[prefixed(0, &[0; 1024])], false), 1024).await.expect("at the limit");
    assert_eq!(at.len(), 1024);
}

#[test]
fn only_uncompressed_calls_are_read_here() {
    let mut headers = HeaderMap::new();
    assert!(read_here(&headers));
    headers.insert(GRPC_ENCODING, HeaderValue::from_static("identity"));
    assert!(read_here(&headers));
    headers.insert(GRPC_ENCODING, HeaderValue::from_static("gzip"));
    assert!(!read_here(&headers));
}

#[tokio::test]
async fn an_answer_is_its_prefixed_message_then_an_ok_status() {
    let answer = ModelInferResponse { model_name: "m".into(), id: "7".into(), ..Default::default() };
    let response = answered(&answer).expect("answered");
    assert_eq!(response.headers().get(CONTENT_TYPE).map(|v| v.as_bytes()), Some(&b"application/grpc"[..]));
    let collected = response.into_body().collect().await.expect("the body");
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(trailers.get(GRPC_STATUS).map(|v| v.as_bytes()), Some(&b"0"[..]));
    let bytes = collected.to_bytes();
    assert_eq!(bytes[0], 0);
    assert_eq!(u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize, bytes.len() - PREFIX_BYTES);
    assert_eq!(ModelInferResponse::decode(&bytes[PREFIX_BYTES..]).expect("decodes"), answer);
}
