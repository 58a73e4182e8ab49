//! Where the server listens: TCP ports, and Unix domain sockets (`--unix-socket`, `--grpc-unix-socket`) for the
//! clients on the same host, a gateway beside it say, whose requests then skip the TCP stack. HTTP's and gRPC's
//! listeners take either, behind the same limits and drain.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::Context as _;
use rustix::net::RecvFlags;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A socket file's mode: its owner and group may connect, others not.
pub const SOCKET_MODE: u32 = 0o660;

/// A listening socket.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixSocket),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::Tcp(listener)
    }
}

impl Listener {
    pub async fn accept(&self) -> io::Result<Stream> {
        let stream = match self {
            Listener::Tcp(l) => Stream::Tcp(l.accept().await?.0),
            Listener::Unix(u) => Stream::Unix(u.listener.accept().await?.0),
        };
        crate::idle::watch(&stream);
        Ok(stream)
    }

    /// Where it listens, for the log: an address, or `unix:` and the socket's path.
    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map_or_else(|e| format!("(unknown: {e})"), |a| a.to_string()),
            Listener::Unix(u) => format!("unix:{}", u.path.display()),
        }
    }
}

impl std::os::fd::AsFd for Listener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(u) => u.listener.as_fd(),
        }
    }
}

/// A Unix domain socket listening at its path; the file goes when it drops (unless another has replaced it).
pub struct UnixSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's inode, so that a file some later server put at the path is left alone.
    inode: u64,
}

impl UnixSocket {
    /// Listens at `path`, a socket file of mode [`SOCKET_MODE`]. A socket file left there by a server that is gone
    /// (nobody accepts on it) is replaced; one that a server still accepts on, or a file of another kind, is an
    /// error.
    pub async fn bind(path: &Path) -> anyhow::Result<UnixSocket> {
        let shown = path.display();
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                if UnixStream::connect(path).await.is_ok() {
                    anyhow::bail!("{shown}: a server is listening on it already");
                }
                std::fs::remove_file(path).with_context(|| format!("{shown}: cannot replace the stale socket"))?;
            }
            Ok(_) => anyhow::bail!("{shown}: the path exists and is not a socket"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("{shown}: cannot read the path")),
        }
        let listener = UnixListener::bind(path).with_context(|| format!("cannot listen on {shown}"))?;
        let inode = std::fs::metadata(path).with_context(|| format!("{shown}: cannot read it back"))?.ino();
        // Dropped on an error from here: the file goes with it.
        let socket = UnixSocket { listener, path: path.to_owned(), inode };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
            .with_context(|| format!("{shown}: cannot set its mode"))?;
        Ok(socket)
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// An accepted connection.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl std::os::fd::AsFd for Stream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

impl Stream {
    /// Answers leave as soon as they are written (Nagle's delay is TCP's alone).
    pub fn set_nodelay(&self) {
        if let Stream::Tcp(s) = self {
            let _ = s.set_nodelay(true);
        }
    }

    /// Waits until the peer has sent something (true), which stays to be read, or has closed (false).
    pub async fn spoke(&self) -> io::Result<bool> {
        let mut first = [0u8; 1];
        match self {
            Stream::Tcp(s) => s.peek(&mut first).await.map(|n| n > 0),
            // tokio has no peek for a Unix stream: readiness, then a peek that may find nothing yet.
            Stream::Unix(s) => loop {
                s.readable().await?;
                let peeked = s.try_io(Interest::READABLE, || {
                    rustix::net::recv(s, &mut first[..], RecvFlags::PEEK).map(|(n, _)| n).map_err(io::Error::from)
                });
                match peeked {
                    Ok(n) => return Ok(n > 0),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            },
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }
}

/// The next connection any of `listeners` accepts.
pub async fn accept_any(listeners: &[Listener]) -> io::Result<Stream> {
    match listeners {
        [one] => one.accept().await,
        many => futures_util::future::select_all(many.iter().map(|l| Box::pin(l.accept()))).await.0,
    }
}
