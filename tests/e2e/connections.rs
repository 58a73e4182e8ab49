//! Connections as clients and attackers use them, over raw sockets: a request head sent in part, idle keep-alive
//! connections, more connections than `--max-connections`, and a drain under 64 keep-alive clients.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferd_tests::{Repo, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn address(server: &TestServer) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

/// Reads until the peer closes; returns what came and how long it took. Errors (a reset) count as closed.
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit.saturating_sub(started.elapsed()), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (all, started.elapsed()),
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
            Err(_) => panic!("still open after {limit:?}: {}", String::from_utf8_lossy(&all)),
        }
    }
}

/// One HTTP/1.1 response off `stream`: status, headers (lower-cased names) and body, by Content-Length.
async fn read_response(stream: &mut TcpStream) -> std::io::Result<(u16, Vec<(String, String)>, Vec<u8>)> {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize =
        headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = data[head_end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        body.extend_from_slice(&buf[..n]);
    }
    Ok((status, headers, body))
}

fn request(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!("{method} {path} HTTP/1.1\r\nHost: inferd\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn a_request_head_sent_in_part_or_not_at_all_is_closed_at_the_header_timeout() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &["--header-read-timeout", "0.5", "--idle-timeout", "30"], None).await;
    let opened = Instant::now();
    let mut silent = TcpStream::connect(address(&server)).await.expect("connects");
    let mut partial = TcpStream::connect(address(&server)).await.expect("connects");
    partial.write_all(b"POST /predict HTTP/1.1\r\nHost: inferd\r\nContent-").await.expect("writes");
    for stream in [&mut silent, &mut partial] {
        let (got, _) = read_to_close(stream, Duration::from_secs(5)).await;
        assert!(got.is_empty(), "closed without an answer: {}", String::from_utf8_lossy(&got));
    }
    let after = opened.elapsed();
    assert!(after >= Duration::from_millis(400) && after < Duration::from_secs(3), "both closed after {after:?}");
    // The probes answered all along.
    let r = server.client.get(server.url("/health/live")).send().await.expect("answers");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_once_idle_past_the_idle_timeout_and_not_before() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &["--header-read-timeout", "10", "--idle-timeout", "0.8"], None).await;
    let mut stream = TcpStream::connect(address(&server)).await.expect("connects");
    // Requests 0.3 s apart keep it open, past the idle timeout in all.
    for _ in 0..5 {
        stream.write_all(&request("GET", "/health/live", "")).await.expect("writes");
        let (status, headers, _) = read_response(&mut stream).await.expect("an answer");
        assert_eq!((status, header(&headers, "connection")), (200, None));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (got, after) = read_to_close(&mut stream, Duration::from_secs(5)).await;
    assert!(got.is_empty());
    assert!(after >= Duration::from_millis(300) && after < Duration::from_secs(3), "closed after {after:?} more");
}

#[tokio::test]
async fn past_max_connections_the_probes_still_answer_and_the_rest_is_shed_quickly() {
    let repo = Repo::new().bundled("digits-candle");
    let args = ["--max-connections", "4", "--header-read-timeout", "30"];
    let server = TestServer::ready(repo.path(), &args, None).await;
    // Four idle connections take every slot.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(address(&server)).await.expect("connects"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (path, want) in [("/health/live", 200), ("/health/ready", 200), ("/v2/health/ready", 200)] {
        let mut probe = TcpStream::connect(address(&server)).await.expect("connects");
        probe.write_all(&request("GET", path, "")).await.expect("writes");
        let (status, headers, _) = read_response(&mut probe).await.expect("an answer");
        assert_eq!(status, want, "{path}");
        assert_eq!(header(&headers, "connection"), Some("close"), "{path}");
    }
    let mut shed = TcpStream::connect(address(&server)).await.expect("connects");
    let started = Instant::now();
    shed.write_all(&request("POST", "/models/digits-candle/predict", &inferd_tests::row_body(1.0)))
        .await
        .expect("writes");
    let (status, headers, body) = read_response(&mut shed).await.expect("an answer");
    assert_eq!((status, header(&headers, "retry-after")), (503, Some("1")));
    assert!(String::from_utf8_lossy(&body).contains("--max-connections (4)"), "{}", String::from_utf8_lossy(&body));
    assert!(started.elapsed() < Duration::from_secs(1));
    // Past the overflow too, a connection is closed at once.
    let mut overflow = Vec::new();
    for _ in 0..inferd_server::connections::OVERFLOW_CONNECTIONS {
        overflow.push(TcpStream::connect(address(&server)).await.expect("connects"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut closed = TcpStream::connect(address(&server)).await.expect("the kernel completes the handshake");
    let (got, after) = read_to_close(&mut closed, Duration::from_secs(5)).await;
    assert!(got.is_empty() && after < Duration::from_secs(1), "closed at once: {after:?}");
    // A slot frees: a request is served in full again.
    drop(held.pop());
    drop(overflow);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = server.post("/models/digits-candle/predict", inferd_tests::row_body(1.0)).await;
    assert_eq!(r.status(), 200);
}

/// 64 keep-alive clients in a closed loop until the server stops taking connections; each counts the requests it
/// had answered, and those it lost: a reset, a broken pipe, or a connection closed before its answer.
async fn drain_under_load(drain_delay: &str) -> (usize, usize, usize) {
    let repo = Repo::new().bundled("digits-candle");
    let mut server = TestServer::ready(repo.path(), &["--drain-delay", drain_delay], None).await;
    let addr = address(&server);
    let (answered, lost, closes) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let body = inferd_tests::row_body(1.0);
    let clients: Vec<_> = (0..64)
        .map(|_| {
            let (addr, body, answered, lost, closes) =
                (addr.clone(), body.clone(), answered.clone(), lost.clone(), closes.clone());
            tokio::spawn(async move {
                'connections: loop {
                    // Refused: the server takes no more connections, as the drain says. Not a lost request.
                    let Ok(mut stream) = TcpStream::connect(&addr).await else { return };
                    loop {
                        if stream.write_all(&request("POST", "/models/digits-candle/predict", &body)).await.is_err() {
                            lost.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        match read_response(&mut stream).await {
                            Ok((status, headers, _)) => {
                                assert!(status == 200 || status == 503, "status {status}");
                                answered.fetch_add(1, Ordering::SeqCst);
                                if header(&headers, "connection") == Some("close") {
                                    closes.fetch_add(1, Ordering::SeqCst);
                                    continue 'connections;
                                }
                            }
                            Err(_) => {
                                lost.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.begin_shutdown();
    for client in clients {
        tokio::time::timeout(Duration::from_secs(30), client).await.expect("the client ends").expect("no panic");
    }
    server.shutdown().await.expect("the server stops cleanly");
    (answered.load(Ordering::SeqCst), lost.load(Ordering::SeqCst), closes.load(Ordering::SeqCst))
}

#[tokio::test]
async fn a_drain_without_delay_loses_no_request_of_64_keep_alive_clients() {
    let (answered, lost, closes) = drain_under_load("0").await;
    eprintln!("drain without delay: {answered} answered, {lost} lost, {closes} with Connection: close");
    assert!(answered > 64, "the clients ran: {answered}");
    assert_eq!(lost, 0, "{answered} answered, {closes} with Connection: close");
}

#[tokio::test]
async fn a_drain_with_delay_loses_no_request_of_64_keep_alive_clients() {
    let (answered, lost, closes) = drain_under_load("0.5").await;
    eprintln!("drain with 0.5 s delay: {answered} answered, {lost} lost, {closes} with Connection: close");
    assert!(closes >= 64, "during the delay every answer says Connection: close: {closes}");
    assert_eq!(lost, 0, "{answered} answered, {closes} with Connection: close");
}

#[tokio::test]
async fn a_body_past_the_in_flight_budget_is_refused_before_it_is_sent() {
    let repo = Repo::new().bundled("digits-candle");
    let args = ["--max-inflight-bytes", "1048576", "--max-body-bytes", "268435456"];
    let server = TestServer::ready(repo.path(), &args, None).await;
    let head = |length: usize, expect: bool| {
        let expect = if expect { "Expect: 100-continue\r\n" } else { "" };
        format!(
            "POST /models/digits-candle/predict HTTP/1.1\r\nHost: inferd\r\nContent-Length: {length}\r\n{expect}\r\n"
        )
    };
    // A slow client: 700 KB announced, none sent yet. Its declared length is held while it sends.
    let mut slow = TcpStream::connect(address(&server)).await.expect("connects");
    slow.write_all(head(700_000, false).as_bytes()).await.expect("writes");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 600 KB more do not fit now: refused at once, and a client that waits for 100 Continue never sends its body.
    let mut stream = TcpStream::connect(address(&server)).await.expect("connects");
    stream.write_all(head(600_000, true).as_bytes()).await.expect("writes");
    let started = Instant::now();
    let (status, headers, body) = read_response(&mut stream).await.expect("an answer");
    assert_eq!((status, header(&headers, "retry-after")), (503, Some("1")), "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("--max-inflight-bytes"));
    assert!(started.elapsed() < Duration::from_secs(1), "at once: {:?}", started.elapsed());
    // 100 MiB would never fit the whole budget: 413, not an invitation to retry.
    let mut stream = TcpStream::connect(address(&server)).await.expect("connects");
    stream.write_all(head(100 << 20, true).as_bytes()).await.expect("writes");
    let (status, _, body) = read_response(&mut stream).await.expect("an answer");
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("whole in-flight budget"));
    drop(slow);
    // A body within the budget is served.
    let r = server.post("/models/digits-candle/predict", inferd_tests::row_body(1.0)).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_client_gone_part_way_through_its_body_leaves_nothing_in_flight_and_the_drain_does_not_wait_for_it() {
    let repo = Repo::new().bundled("digits-candle");
    let mut server = TestServer::ready(repo.path(), &["--drain-timeout", "30"], None).await;
    let labels = [("model", "digits-candle"), ("protocol", "predict")];
    for _ in 0..4 {
        let mut stream = TcpStream::connect(address(&server)).await.expect("connects");
        let head = "POST /models/digits-candle/predict HTTP/1.1\r\nHost: inferd\r\nContent-Type: application/json\r\n\
                    Content-Length: 100000\r\n\r\n{\"input\": [[";
        stream.write_all(head.as_bytes()).await.expect("writes");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(stream);
    }
    let mut gauge = f64::NAN;
    for _ in 0..50 {
        gauge = server.metrics().await.value("inferd_requests_in_flight", &labels);
        if gauge == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(gauge, 0.0, "the requests whose clients left are still counted in flight");
    let started = Instant::now();
    server.begin_shutdown();
    server.shutdown().await.expect("the server stops cleanly");
    // Nothing is in flight, so the drain ends once quiet, not at its 30 s timeout.
    assert!(started.elapsed() < Duration::from_secs(10), "the drain took {:?}", started.elapsed());
}
