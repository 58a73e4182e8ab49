//! Triton's shared memory: regions that a client on the same host made and registered by name, which its requests
//! then name for their inputs and outputs. System shared memory (POSIX, under `/dev/shm`) is opened and mapped once,
//! at registration: an engine reads inputs where the client wrote them, and outputs are copied straight into the
//! client's memory. A client that shrinks its object under a registered region fails its own requests, not the
//! server ([`mapping`]). CUDA shared memory (a GPU allocation's IPC handle, [`cuda`]) is opened once too, and read
//! and written by copies to and from the host. Both kinds share one namespace, as in Triton. A region unregistered
//! while requests use it stays open until the last of them lets go of it.
//!
//! Off unless the server is started with `--allow-client-shm`: a registered key reaches any shared-memory object the
//! server's user may open (a handle, any GPU memory its owner exported), so it is for a gateway on the same host
//! that the operator trusts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use inferd_codec::quoted;
use inferd_codec::shm::{Region, Regions};
use rustix::fs::{Mode, OFlags};

use crate::error::AppError;
use crate::metrics::Metrics;

mod cuda;
mod mapping;

pub use cuda::{CudaRegion, CudaRegionStatus, Handle};
use mapping::Mapping;

/// Where Linux keeps POSIX shared-memory objects: `shm_open("/name")` opens `/dev/shm/name`.
pub const SHM_DIR: &str = "/dev/shm";

/// The registered regions, by name.
pub struct SharedMemory {
    allowed: bool,
    regions: Mutex<BTreeMap<String, Registered>>,
    /// How many of `regions` are CUDA ones, kept with the metrics' count: read by every v2 request, without the lock.
    cuda_regions: AtomicUsize,
    metrics: Arc<Metrics>,
}

/// The two kinds of region, each with its own register, status and unregister calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    System,
    Cuda,
}

impl Kind {
    /// The kind's name in messages and in the metrics' `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::System => "system",
            Kind::Cuda => "cuda",
        }
    }
}

/// A registered region of either kind.
#[derive(Clone)]
enum Registered {
    System(Arc<SystemRegion>),
    Cuda(Arc<CudaRegion>),
}

impl Registered {
    fn kind(&self) -> Kind {
        match self {
            Registered::System(_) => Kind::System,
            Registered::Cuda(_) => Kind::Cuda,
        }
    }

    fn byte_size(&self) -> u64 {
        match self {
            Registered::System(r) => r.byte_size,
            Registered::Cuda(r) => r.byte_size,
        }
    }
}

/// A registered region: `byte_size` bytes at `offset` in the object `key`.
pub struct SystemRegion {
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
    memory: Mapping,
}

/// A region as the status calls show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct RegionStatus {
    pub name: String,
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
}

impl SharedMemory {
    /// No regions yet; registering refused unless `allowed`.
    pub fn new(allowed: bool, metrics: Arc<Metrics>) -> SharedMemory {
        let memory = SharedMemory { allowed, regions: Mutex::default(), cuda_regions: AtomicUsize::new(0), metrics };
        memory.count();
        memory
    }

    fn regions(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Registered>> {
        self.regions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether any region is registered: requests name none otherwise.
    pub fn in_use(&self) -> bool {
        !self.regions().is_empty()
    }

    /// Whether a CUDA region is registered: a request that names a region may then copy from or to a GPU.
    pub fn has_cuda(&self) -> bool {
        self.cuda_regions.load(Ordering::Relaxed) > 0
    }

    /// Registers `byte_size` bytes at `offset` in the object `key` as region `name`. Opens the object: off the async
    /// runtime.
    pub async fn register(
        self: &Arc<Self>,
        name: String,
        key: String,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), AppError> {
        self.register_with(name, Kind::System, move || {
            SystemRegion::open(key, offset, byte_size).map(|r| Registered::System(Arc::new(r)))
        })
        .await
    }

    /// Registers `byte_size` bytes of the GPU memory whose CUDA IPC handle is `handle`, on GPU `device`, as region
    /// `name`. Opens the handle: off the async runtime.
    pub async fn register_cuda(
        self: &Arc<Self>,
        name: String,
        handle: Handle,
        device: i64,
        byte_size: u64,
    ) -> Result<(), AppError> {
        self.register_with(name, Kind::Cuda, move || {
            CudaRegion::open(handle, device, byte_size).map(|r| Registered::Cuda(Arc::new(r)))
        })
        .await
    }

    /// Registers what `open` opens, of `kind`, as region `name`, where that name is free.
    async fn register_with(
        self: &Arc<Self>,
        name: String,
        kind: Kind,
        open: impl FnOnce() -> Result<Registered, AppError> + Send + 'static,
    ) -> Result<(), AppError> {
        if !self.allowed {
            return Err(AppError::bad_request(format!(
                "{} shared memory is off: start inferd with --allow-client-shm to let clients on this host register \
                 regions",
                kind.as_str()
            )));
        }
        if name.is_empty() {
            return Err(AppError::bad_request("a shared memory region needs a name"));
        }
        if self.regions().contains_key(&name) {
            return Err(AppError::bad_request(format!(
                "shared memory region `{}` is registered already: unregister it first",
                quoted(&name)
            )));
        }
        let region = tokio::task::spawn_blocking(open)
            .await
            .map_err(|e| AppError::internal(format!("opening a shared memory region: {e}")))??;
        let mut regions = self.regions();
        if regions.contains_key(&name) {
            return Err(AppError::bad_request(format!(
                "shared memory region `{}` is registered already",
                quoted(&name)
            )));
        }
        regions.insert(name, region);
        drop(regions);
        self.count();
        Ok(())
    }

    /// Unregisters region `name` of `kind`, or every region of that kind: a name not registered (as that kind) is no
    /// error, as in Triton. Requests that hold a region keep it until they end. A CUDA region that none holds is
    /// closed before this returns, as in Triton, since its client may free the memory once answered: on a blocking
    /// thread.
    pub async fn unregister(&self, kind: Kind, name: Option<&str>) {
        // Taken out under the lock, closed (where no request holds them) after it.
        let removed: Vec<Registered> = {
            let mut regions = self.regions();
            match name {
                Some(name) if regions.get(name).is_some_and(|r| r.kind() == kind) => {
                    regions.remove(name).into_iter().collect()
                }
                Some(_) => Vec::new(),
                None => {
                    let (taken, kept) = std::mem::take(&mut *regions).into_iter().partition(|(_, r)| r.kind() == kind);
                    *regions = kept;
                    taken.into_values().collect()
                }
            }
        };
        self.count();
        let closing: Vec<CudaRegion> = removed
            .into_iter()
            .filter_map(|r| match r {
                Registered::Cuda(r) => Arc::into_inner(r),
                Registered::System(_) => None,
            })
            .collect();
        if !closing.is_empty() {
            let closed = tokio::task::spawn_blocking(move || closing.into_iter().for_each(CudaRegion::close)).await;
            if let Err(e) = closed {
                tracing::warn!(error = %e, "closing unregistered CUDA shared memory");
            }
        }
    }

    /// Region `name`'s status, or every system region's: refused for a name not registered as one.
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>, AppError> {
        self.statuses(name, |name, r| match r {
            Registered::System(r) => Some(RegionStatus {
                name: name.to_owned(),
                key: r.key.clone(),
                offset: r.offset,
                byte_size: r.byte_size,
            }),
            Registered::Cuda(_) => None,
        })
    }

    /// CUDA region `name`'s status, or every CUDA region's: refused for a name not registered as one.
    pub fn cuda_status(&self, name: Option<&str>) -> Result<Vec<CudaRegionStatus>, AppError> {
        self.statuses(name, |name, r| match r {
            Registered::Cuda(r) => Some(r.status(name)),
            Registered::System(_) => None,
        })
    }

    fn statuses<T>(
        &self,
        name: Option<&str>,
        shown: impl Fn(&str, &Registered) -> Option<T>,
    ) -> Result<Vec<T>, AppError> {
        let regions = self.regions();
        match name {
            None => Ok(regions.iter().filter_map(|(name, r)| shown(name, r)).collect()),
            Some(name) => match regions.get(name).and_then(|r| shown(name, r)) {
                Some(status) => Ok(vec![status]),
                None => Err(not_registered(name)),
            },
        }
    }

    /// The metrics' count of regions and their bytes, by kind.
    fn count(&self) {
        let regions = self.regions();
        for kind in [Kind::System, Kind::Cuda] {
            let (count, bytes) = regions
                .values()
                .filter(|r| r.kind() == kind)
                .fold((0, 0), |(count, bytes), r| (count + 1, bytes + r.byte_size()));
            self.metrics.shared_memory(kind.as_str(), count, bytes);
            if kind == Kind::Cuda {
                self.cuda_regions.store(count, Ordering::Relaxed);
            }
        }
    }
}

/// The error for a region name that is not registered.
pub fn not_registered(name: &str) -> AppError {
    AppError::bad_request(format!("shared memory region `{}` is not registered", quoted(name)))
}

impl Regions for SharedMemory {
    fn region(&self, name: &str) -> Option<Arc<dyn Region>> {
        self.regions().get(name).map(|r| match r {
            Registered::System(r) => r.clone() as Arc<dyn Region>,
            Registered::Cuda(r) => r.clone() as Arc<dyn Region>,
        })
    }
}

impl SystemRegion {
    /// Opens the object `key` for a region of `byte_size` bytes at `offset`: refused where the key is not a
    /// shared-memory name, the object is missing, is not a plain file (a link, say), or is too small.
    fn open(key: String, offset: u64, byte_size: u64) -> Result<SystemRegion, AppError> {
        let file = object_name(&key).ok_or_else(|| {
            AppError::bad_request(format!(
                "key `{}` is not a POSIX shared-memory name: give the name its creator passed to shm_open (`/name`: \
                 no other slash, not . or ..), not a path",
                quoted(&key)
            ))
        })?;
        if byte_size == 0 {
            return Err(AppError::bad_request("a shared memory region's byte_size must be 1 or more"));
        }
        let path = Path::new(SHM_DIR).join(file);
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let fd = rustix::fs::open(&path, flags, Mode::empty())
            .map_err(|e| AppError::bad_request(format!("cannot open shared memory object `{}`: {e}", quoted(&key))))?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata().map_err(|e| AppError::internal(format!("shared memory object: {e}")))?;
        if !meta.file_type().is_file() {
            return Err(AppError::bad_request(format!("`{}` is not a shared memory object", quoted(&key))));
        }
        let end = offset.checked_add(byte_size).filter(|&end| end <= meta.len()).ok_or_else(|| {
            AppError::bad_request(format!(
                "shared memory object `{}` holds {} bytes: too small for {byte_size} bytes at offset {offset}",
                quoted(&key),
                meta.len()
            ))
        })?;
        // Spans are checked against the region as usize.
        usize::try_from(end).map_err(|_| AppError::bad_request("the region is larger than this machine addresses"))?;
        let memory = Mapping::new(&file, offset, byte_size as usize)
            .map_err(|e| AppError::bad_request(format!("cannot map shared memory object `{}`: {e}", quoted(&key))))?;
        Ok(SystemRegion { key, offset, byte_size, memory })
    }
}

/// The file under [`SHM_DIR`] that the shared-memory name `key` opens: `None` where it is not such a name. As
/// `shm_open` reads it, leading slashes are dropped; what is left must be a plain file name.
pub fn object_name(key: &str) -> Option<&str> {
    let name = key.trim_start_matches('/');
    let plain = !name.is_empty() && name.len() <= 255 && !name.contains(['/', '\0']) && name != "." && name != "..";
    plain.then_some(name)
}

impl Region for SystemRegion {
    fn byte_size(&self) -> usize {
        // Checked to fit at registration.
        self.byte_size as usize
    }

    fn read(self: Arc<Self>, offset: usize, len: usize) -> std::io::Result<Bytes> {
        Ok(Bytes::from_owner(InPlace { region: self, offset, len }))
    }

    fn reads_in_place(&self) -> bool {
        true
    }

    fn write(&self, offset: usize, bytes: &[u8]) -> std::io::Result<()> {
        self.memory.write(offset, bytes)
    }

    fn intact(&self) -> bool {
        self.memory.intact()
    }
}

/// A span of a region's memory, read in place: the region stays mapped while these bytes are held.
struct InPlace {
    region: Arc<SystemRegion>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for InPlace {
    fn as_ref(&self) -> &[u8] {
        // The span was checked against the region.
        self.region.memory.bytes().get(self.offset..self.offset + self.len).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_shared_memory_names_never_paths() {
        for (key, file) in [("/input", Some("input")), ("input", Some("input")), ("//a.b-c_1", Some("a.b-c_1"))] {
            assert_eq!(object_name(key), file, "{key}");
        }
        for key in ["", "/", "/..", "/.", "/dev/shm/x", "../etc/passwd", "/a/b", "a\0b"] {
            assert_eq!(object_name(key), None, "{key}");
        }
        assert_eq!(object_name(&"x".repeat(256)), None);
    }

    #[test]
    fn a_region_is_read_in_place_and_an_object_that_shrank_fails_its_requests_not_the_server() {
        let key = format!("/inferd-unit-{}", std::process::id());
        let path = Path::new(SHM_DIR).join(object_name(&key).expect("a name"));
        let bytes: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).expect("write the object");
        let region = SystemRegion::open(key, 8, 3 * 4096 - 8).map(Arc::new);
        let checks = region.as_ref().map(|region| {
            let within = region.clone().read(4, 100).expect("read");
            let in_place = within.as_ptr() == region.memory.bytes()[4..].as_ptr();
            let written = region.write(0, &[7, 8, 9]).map(|()| std::fs::read(&path).map(|b| b[8..12].to_vec()));
            let before = region.intact();
            // The object shrinks to its first page under the registered region: touching the rest faults, which
            // the server survives, reading zeros, with the region marked as no longer the client's.
            let shrunk = std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(4096));
            let past = region.clone().read(6000, 16).expect("read").to_vec();
            let after = (region.intact(), region.write(6000, &[1]).is_ok(), region.intact());
            (within, in_place, written, before, shrunk, past, after)
        });
        std::fs::remove_file(&path).expect("remove the object");
        let (within, in_place, written, before, shrunk, past, after) = checks.expect("registered");
        assert!(in_place, "the bytes are the mapping's own");
        assert_eq!(written.expect("written").expect("read back"), [7, 8, 9, bytes[11]]);
        assert!(before);
        shrunk.expect("shrink");
        assert_eq!(past, [0; 16]);
        assert_eq!(after, (false, true, false));
        // The whole mapping is the server's zeros now, the bytes read before it shrank included.
        assert_eq!(within.to_vec(), vec![0; 100]);
    }
}
