//! `inferd healthcheck`: the container's health check, one plain HTTP/1.1 GET to the server on 127.0.0.1, with no
//! HTTP client library and no shell in the image.

use std::time::Duration;

use anyhow::Context;

use crate::config::HealthcheckConfig;

/// `inferd healthcheck`: one plain HTTP/1.1 GET to 127.0.0.1; `Ok` when the answer is 200.
pub async fn healthcheck(config: &HealthcheckConfig) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let timeout = Duration::try_from_secs_f64(config.timeout).unwrap_or(Duration::from_secs(3));
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", config.port.get()))
            .await
            .with_context(|| format!("nothing answers on 127.0.0.1:{}", config.port.get()))?;
        let request = format!("GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", config.path);
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.take(64 * 1024).read_to_end(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| anyhow::anyhow!("no answer from 127.0.0.1:{} within {timeout:?}", config.port.get()))??;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1).unwrap_or("none");
    if status == "200" {
        Ok(())
    } else {
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
        anyhow::bail!("{} answered {status}: {body}", config.path)
    }
}
