//! Triton's shared-memory parameters: an input read from, or an output written to, a span of a region that the
//! client registered beforehand, named in the tensor's `shared_memory_region`, `shared_memory_byte_size` and
//! `shared_memory_offset` parameters (the same three over HTTP and gRPC). The regions are the server's; the codec
//! sees them through [`Regions`], and checks every span against its region before a byte moves.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use inferd_core::DataType;

use super::{quoted, CodecError};

/// The parameter that names the registered region a tensor is in.
pub const REGION_PARAMETER: &str = "shared_memory_region";
/// The parameter that gives the tensor's size in bytes within its region.
pub const BYTE_SIZE_PARAMETER: &str = "shared_memory_byte_size";
/// The parameter that gives where in the region the tensor starts (0 when absent).
pub const OFFSET_PARAMETER: &str = "shared_memory_offset";

/// A registered region's memory: bytes that the client shares with the server.
pub trait Region: Send + Sync {
    /// Its bytes.
    fn byte_size(&self) -> usize;
    /// `len` bytes from `offset`, within the region (the caller checked the span): the region's own memory where it
    /// can be read in place (held, with the region, for as long as the bytes are), else a copy.
    fn read(self: Arc<Self>, offset: usize, len: usize) -> std::io::Result<Bytes>;
    /// Writes `bytes` at `offset`, within the region (the caller checked the span).
    fn write(&self, offset: usize, bytes: &[u8]) -> std::io::Result<()>;
    /// Whether [`Region::read`] gives the region's own memory, which the client can change while it is read, rather
    /// than a copy.
    fn reads_in_place(&self) -> bool {
        false
    }
    /// Whether the region is a GPU's memory (CUDA shared memory): each read and write is a copy to or from the
    /// device, which blocks on the driver and is best made once, whole.
    fn on_device(&self) -> bool {
        false
    }
    /// Whether every read and write so far reached the client's memory: `false` once the region was found to have
    /// lost some of it (its object shrank), whatever a read then gave.
    fn intact(&self) -> bool {
        true
    }
}

/// The regions registered with the server, by name.
pub trait Regions: Sync {
    /// The region registered as `name`: the handle keeps it usable while held, unregistered or not.
    fn region(&self, name: &str) -> Option<Arc<dyn Region>>;
}

/// No region at all: where shared memory is not in use.
pub struct NoRegions;

impl Regions for NoRegions {
    fn region(&self, _: &str) -> Option<Arc<dyn Region>> {
        None
    }
}

/// A tensor's span of a registered region, checked against it.
#[derive(Clone)]
pub struct Span {
    region: Arc<dyn Region>,
    name: String,
    offset: usize,
    size: usize,
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Span({}, {}+{})", self.name, self.offset, self.size)
    }
}

/// The three parameters as a tensor gave them.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpanParameters<'a> {
    pub region: Option<&'a str>,
    pub byte_size: Option<u64>,
    pub offset: Option<u64>,
}

impl Span {
    /// The span that `given` names, for the tensor `what` (`input "x"`, say): `None` where it names none. Refused
    /// where only some of the parameters are given, the region is not registered, or the span runs past its end.
    pub fn of(
        given: SpanParameters<'_>,
        regions: &dyn Regions,
        what: impl fmt::Display,
    ) -> Result<Option<Span>, CodecError> {
        let invalid = |m: String| CodecError::Invalid(format!("{what}: {m}"));
        let (name, size) = match (given.region, given.byte_size) {
            (None, None) if given.offset.is_none() => return Ok(None),
            (Some(name), Some(size)) => (name, size),
            (Some(_), None) => return Err(invalid(format!("{REGION_PARAMETER} needs {BYTE_SIZE_PARAMETER} too"))),
            (None, _) => {
                return Err(invalid(format!(
                    "{BYTE_SIZE_PARAMETER} and {OFFSET_PARAMETER} need {REGION_PARAMETER}, the region's name"
                )))
            }
        };
        let region = regions
            .region(name)
            .ok_or_else(|| invalid(format!("shared memory region `{}` is not registered", quoted(name))))?;
        let offset = given.offset.unwrap_or(0);
        let end = offset.checked_add(size).filter(|&end| end <= region.byte_size() as u64).ok_or_else(|| {
            invalid(format!(
                "bytes {offset} to {} run past the end of shared memory region `{}`, which holds {} bytes",
                offset.saturating_add(size),
                quoted(name),
                region.byte_size()
            ))
        })?;
        // Within the region's length, a usize.
        let (offset, end) = (offset as usize, end as usize);
        Ok(Some(Span { region, name: name.to_owned(), offset, size: end - offset }))
    }

    /// The region's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The span's bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the span's region is a GPU's memory (see [`Region::on_device`]).
    pub fn on_device(&self) -> bool {
        self.region.on_device()
    }

    /// The span's bytes, in place where the region allows (see [`Region::read`]). Whether they were the client's
    /// is known only once the request is done with them: see [`Span::intact`].
    pub fn read(&self) -> Result<Bytes, String> {
        self.intact()?;
        self.region.clone().read(self.offset, self.size).map_err(|e| self.failed("reading", &e))
    }

    /// The span's bytes as an input of `dtype` takes them: a floating-point one's in place where the region allows
    /// (see [`Span::read`]), any other's copied. An engine checks an integer input (an index, a shape) before it uses
    /// it, and read in place the client could change it in between; a float changed so only changes the answer.
    pub fn read_input(&self, dtype: DataType) -> Result<Bytes, String> {
        let bytes = self.read()?;
        let in_place = self.region.reads_in_place();
        Ok(if in_place && Span::copies(dtype) { Bytes::copy_from_slice(&bytes) } else { bytes })
    }

    /// Whether an input of `dtype` is copied out of shared memory (see [`Span::read_input`]): work to decode.
    pub fn copies(dtype: DataType) -> bool {
        !dtype.is_float()
    }

    /// Refused where the region has lost memory that it had when registered (see [`Region::intact`]): what a
    /// request read from it, or wrote to it, may not have been the client's.
    pub fn intact(&self) -> Result<(), String> {
        if self.region.intact() {
            return Ok(());
        }
        Err(format!(
            "shared memory region `{}` lost its memory while in use: its object became smaller than the region \
             registered. Unregister the region and register it again",
            quoted(&self.name)
        ))
    }

    /// Writes `bytes` at the span's start: refused where they do not fit it.
    pub fn write(&self, bytes: &[u8]) -> Result<(), String> {
        self.fits(bytes.len())?;
        self.write_at(0, bytes)?;
        self.intact()
    }

    /// Refused where `len` bytes, written from the span's start, would not fit it.
    pub fn fits(&self, len: usize) -> Result<(), String> {
        if len > self.size {
            return Err(format!(
                "it needs {len} bytes, but its span of shared memory region `{}` ({BYTE_SIZE_PARAMETER}) holds {}",
                quoted(&self.name),
                self.size
            ));
        }
        Ok(())
    }

    /// Writes `bytes` at `offset` within the span (a piece of a larger write): refused past its end. Whether they
    /// reached the client's memory is for [`Span::intact`] to say, once the whole is written.
    pub fn write_at(&self, offset: usize, bytes: &[u8]) -> Result<(), String> {
        let end = offset.checked_add(bytes.len()).filter(|&end| end <= self.size);
        self.fits(end.unwrap_or(usize::MAX))?;
        self.region.write(self.offset + offset, bytes).map_err(|e| self.failed("writing", &e))
    }

    fn failed(&self, doing: &str, e: &std::io::Error) -> String {
        format!("{doing} shared memory region `{}`: {e}", quoted(&self.name))
    }
}

/// Refused where a span that a request's inputs were read from (`read`) lost its memory while the request used it:
/// for the answer, once the engine is done with the inputs.
pub fn inputs_intact(read: &[Span]) -> Result<(), CodecError> {
    read.iter().try_for_each(|span| span.intact().map_err(|m| CodecError::Invalid(format!("an input's {m}"))))
}

/// Regions held in memory, by name: for tests and fuzzing, which need no operating-system shared memory.
#[derive(Default)]
pub struct MemoryRegions(pub Vec<(String, Arc<MemoryRegion>)>);

/// One region held in memory; one made by [`MemoryRegion::device`] stands in for a GPU's (see
/// [`Region::on_device`]).
#[derive(Default)]
pub struct MemoryRegion {
    bytes: std::sync::Mutex<Vec<u8>>,
    device: bool,
}

impl MemoryRegion {
    pub fn new(bytes: Vec<u8>) -> Arc<MemoryRegion> {
        Arc::new(MemoryRegion { bytes: std::sync::Mutex::new(bytes), device: false })
    }

    /// A region that says it is a GPU's memory, as CUDA shared memory's do.
    pub fn device(bytes: Vec<u8>) -> Arc<MemoryRegion> {
        Arc::new(MemoryRegion { bytes: std::sync::Mutex::new(bytes), device: true })
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().map(|b| b.clone()).unwrap_or_default()
    }
}

impl Region for MemoryRegion {
    fn byte_size(&self) -> usize {
        self.bytes.lock().map(|b| b.len()).unwrap_or(0)
    }

    fn read(self: Arc<Self>, offset: usize, len: usize) -> std::io::Result<Bytes> {
        let bytes = self.bytes.lock().map_err(|_| std::io::Error::other("poisoned"))?;
        Ok(Bytes::copy_from_slice(&bytes[offset..offset + len]))
    }

    fn write(&self, offset: usize, bytes: &[u8]) -> std::io::Result<()> {
        let mut held = self.bytes.lock().map_err(|_| std::io::Error::other("poisoned"))?;
        held[offset..offset + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn on_device(&self) -> bool {
        self.device
    }
}

impl Regions for MemoryRegions {
    fn region(&self, name: &str) -> Option<Arc<dyn Region>> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, r)| r.clone() as Arc<dyn Region>)
    }
}

#[cfg(test)]
#[path = "shm_tests.rs"]
mod tests;
