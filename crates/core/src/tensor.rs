//! A typed, row-major tensor backed by little-endian bytes, with whole-row concat and split along dim 0.

use bytes::Bytes;

use crate::dtype::{DataType, Element};
use crate::error::{Error, Result};

/// A tensor: data type, concrete shape, and its elements in row-major order.
///
/// Fixed-size types keep their elements as little-endian bytes; `BYTES` keeps one byte string per element.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    dtype: DataType,
    shape: Vec<usize>,
    data: TensorData,
}

/// The storage of a [`Tensor`].
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// Little-endian elements of a fixed-size data type: shared, so that a batch's output is split into its
    /// requests' rows, and memory another owner holds (an engine's output, a client's shared memory) is taken,
    /// without a copy.
    Fixed(Bytes),
    /// One byte string per element (`BYTES`).
    Bytes(Vec<Vec<u8>>),
}

/// The number of elements of `shape`, or an error if it overflows `usize`.
pub fn element_count(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::InvalidInput(format!("shape {shape:?} has more elements than this machine can address")))
}

impl Tensor {
    /// A tensor of a fixed-size type from its little-endian bytes (a `Vec<u8>`, or [`Bytes`] that another owner
    /// holds); the length must match the shape.
    pub fn new(dtype: DataType, shape: Vec<usize>, data: impl Into<Bytes>) -> Result<Self> {
        let data = data.into();
        let Some(size) = dtype.size() else {
            return Err(Error::InvalidInput("BYTES tensors are built with Tensor::from_byte_strings".into()));
        };
        let expected = element_count(&shape)?
            .checked_mul(size)
            .ok_or_else(|| Error::InvalidInput(format!("shape {shape:?} is too large")))?;
        if data.len() != expected {
            return Err(Error::InvalidInput(format!(
                "{dtype} tensor of shape {shape:?} needs {expected} bytes, got {}",
                data.len()
            )));
        }
        Ok(Tensor { dtype, shape, data: TensorData::Fixed(data) })
    }

    /// A `BYTES` tensor from one byte string per element.
    pub fn from_byte_strings(shape: Vec<usize>, elements: Vec<Vec<u8>>) -> Result<Self> {
        let expected = element_count(&shape)?;
        if elements.len() != expected {
            return Err(Error::InvalidInput(format!(
                "BYTES tensor of shape {shape:?} needs {expected} elements, got {}",
                elements.len()
            )));
        }
        Ok(Tensor { dtype: DataType::Bytes, shape, data: TensorData::Bytes(elements) })
    }

    /// A tensor from typed elements.
    pub fn from_slice<T: Element>(shape: Vec<usize>, values: &[T]) -> Result<Self> {
        // One copy into memory that is not asked to be zeroed: jemalloc zeroes a reused block of many megabytes by
        // handing its pages back, and each page then faults in again on the first write.
        Tensor::new(T::DTYPE, shape, crate::dtype::le_bytes(values).into_owned())
    }

    /// A tensor of zeros (empty strings for `BYTES`).
    pub fn zeros(dtype: DataType, shape: Vec<usize>) -> Result<Self> {
        let count = element_count(&shape)?;
        match dtype.size() {
            Some(size) => {
                let bytes = count
                    .checked_mul(size)
                    .ok_or_else(|| Error::InvalidInput(format!("shape {shape:?} is too large")))?;
                Tensor::new(dtype, shape, vec![0; bytes])
            }
            None => Tensor::from_byte_strings(shape, vec![Vec::new(); count]),
        }
    }

    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// The little-endian bytes of a fixed-size tensor; `None` for `BYTES`.
    pub fn raw_bytes(&self) -> Option<&[u8]> {
        match &self.data {
            TensorData::Fixed(bytes) => Some(bytes),
            TensorData::Bytes(_) => None,
        }
    }

    /// The byte strings of a `BYTES` tensor; `None` for fixed-size types.
    pub fn byte_strings(&self) -> Option<&[Vec<u8>]> {
        match &self.data {
            TensorData::Bytes(elements) => Some(elements),
            TensorData::Fixed(_) => None,
        }
    }

    pub fn element_count(&self) -> usize {
        // The constructors checked that the count fits.
        self.shape.iter().product()
    }

    /// The first element that is NaN or infinite, by flat index, with its value; `None` for a tensor of finite
    /// numbers or of a type that cannot hold anything else.
    pub fn first_non_finite(&self) -> Option<(usize, f64)> {
        first_non_finite_in(self.dtype, self.raw_bytes()?)
    }

    /// Hands a fixed-size tensor's bytes to `write` a block at a time, as `(offset, block)`, each block once it is
    /// scanned as [`Tensor::first_non_finite`] scans: the scan and a copy in one pass over memory, where the two apart
    /// would read the tensor twice. Stops before the block that holds the first NaN or infinity, and returns that
    /// element; an error of `write` stops it too. Hands nothing on for `BYTES`.
    pub fn write_finite<E>(
        &self,
        mut write: impl FnMut(usize, &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<Option<(usize, f64)>, E> {
        let (Some(bytes), Some(size)) = (self.raw_bytes(), self.dtype.size()) else { return Ok(None) };
        // Small enough that the block is still in the core's cache when it is copied.
        let block = WRITE_BLOCK_ELEMENTS * size;
        for (i, chunk) in bytes.chunks(block).enumerate() {
            if let Some((index, value)) = first_non_finite_in(self.dtype, chunk) {
                return Ok(Some((i * WRITE_BLOCK_ELEMENTS + index, value)));
            }
            write(i * block, chunk)?;
        }
        Ok(None)
    }

    /// Rows along dim 0 (the batch dimension); 1 for a scalar.
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Elements in one row: the product of the non-batch dimensions.
    fn row_elements(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// The elements as `T`, which must be this tensor's element type.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        match &self.data {
            TensorData::Fixed(bytes) if self.dtype == T::DTYPE => Ok(match T::view(bytes) {
                Some(elements) => elements.to_vec(),
                None => bytes.chunks_exact(T::SIZE).map(T::get).collect(),
            }),
            _ => Err(Error::InvalidInput(format!("tensor is {}, not {}", self.dtype, T::DTYPE))),
        }
    }

    /// The elements, borrowed: `None` where the tensor is not of `T`, or its bytes cannot be seen as `T`s without
    /// a copy (see [`Element::view`]).
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        match &self.data {
            TensorData::Fixed(bytes) if self.dtype == T::DTYPE => T::view(bytes),
            _ => None,
        }
    }

    /// Joins tensors along dim 0, copying whole rows (a lone fixed-size part is shared, not copied). Every part
    /// must have the same data type and the same non-batch dimensions.
    pub fn concat_rows(parts: &[&Tensor]) -> Result<Tensor> {
        let Some(first) = parts.first() else {
            return Err(Error::InvalidInput("nothing to concatenate".into()));
        };
        if first.shape.is_empty() {
            return Err(Error::InvalidInput("scalars have no rows to concatenate".into()));
        }
        if let ([only], TensorData::Fixed(_)) = (parts, &first.data) {
            return Ok((*only).clone());
        }
        let mut rows = 0usize;
        for part in parts {
            if part.dtype != first.dtype || part.shape.get(1..) != first.shape.get(1..) {
                return Err(Error::InvalidInput(format!(
                    "cannot concatenate {} {:?} with {} {:?}",
                    first.dtype, first.shape, part.dtype, part.shape
                )));
            }
            rows += part.rows();
        }
        let mut shape = first.shape.clone();
        shape[0] = rows;
        let data = match &first.data {
            TensorData::Fixed(_) => {
                let total: usize = parts.iter().filter_map(|p| p.raw_bytes()).map(<[u8]>::len).sum();
                let mut out = Vec::with_capacity(total);
                for part in parts.iter().filter_map(|p| p.raw_bytes()) {
                    out.extend_from_slice(part);
                }
                TensorData::Fixed(out.into())
            }
            TensorData::Bytes(_) => {
                let mut out = Vec::with_capacity(parts.iter().map(|p| p.element_count()).sum());
                for part in parts.iter().filter_map(|p| p.byte_strings()) {
                    out.extend_from_slice(part);
                }
                TensorData::Bytes(out)
            }
        };
        Ok(Tensor { dtype: first.dtype, shape, data })
    }

    /// Joins fixed-size tensors of rank 2 or more along dim 0, padding each part's dim 1 with zeros to the longest:
    /// how token sequences of different lengths share a batch. Dimensions after the second must match.
    pub fn concat_rows_padded(parts: &[&Tensor]) -> Result<Tensor> {
        let Some(first) = parts.first() else {
            return Err(Error::InvalidInput("nothing to concatenate".into()));
        };
        let Some(size) = first.dtype.size().filter(|_| first.shape.len() >= 2) else {
            return Err(Error::InvalidInput(format!(
                "padding joins fixed-size tensors of rank 2 or more, not {} {:?}",
                first.dtype, first.shape
            )));
        };
        let mut rows = 0usize;
        let mut longest = 0usize;
        for part in parts {
            if part.dtype != first.dtype || part.shape.len() != first.shape.len() || part.shape[2..] != first.shape[2..]
            {
                return Err(Error::InvalidInput(format!(
                    "cannot pad and concatenate {} {:?} with {} {:?}",
                    first.dtype, first.shape, part.dtype, part.shape
                )));
            }
            rows += part.shape[0];
            longest = longest.max(part.shape[1]);
        }
        let inner: usize = first.shape[2..].iter().product::<usize>() * size;
        let mut shape = first.shape.clone();
        shape[0] = rows;
        shape[1] = longest;
        let mut out = Vec::with_capacity(element_count(&shape)? * size);
        for part in parts {
            let row_bytes = part.shape[1] * inner;
            for row in part.raw_bytes().unwrap_or_default().chunks_exact(row_bytes.max(1)).take(part.shape[0]) {
                out.extend_from_slice(row);
                out.resize(out.len() + (longest - part.shape[1]) * inner, 0);
            }
        }
        Tensor::new(first.dtype, shape, out)
    }

    /// Splits along dim 0 into consecutive pieces of `counts` rows each: a fixed-size tensor's pieces share its
    /// bytes, a `BYTES` tensor's are copies. The counts must add up to the number of rows.
    pub fn split_rows(&self, counts: &[usize]) -> Result<Vec<Tensor>> {
        if self.shape.is_empty() {
            return Err(Error::InvalidInput("a scalar has no rows to split".into()));
        }
        let total: usize = counts.iter().sum();
        if total != self.rows() {
            return Err(Error::InvalidInput(format!(
                "cannot split {} rows into pieces of {counts:?} rows",
                self.rows()
            )));
        }
        let row_elements = self.row_elements();
        let mut start = 0usize;
        let mut pieces = Vec::with_capacity(counts.len());
        for &rows in counts {
            let mut shape = self.shape.clone();
            shape[0] = rows;
            let (from, to) = (start * row_elements, (start + rows) * row_elements);
            let data = match &self.data {
                TensorData::Fixed(bytes) => {
                    // Fixed-size data always has a size; `new` refused anything else. Rows of the same bytes.
                    let size = self.dtype.size().unwrap_or(1);
                    TensorData::Fixed(bytes.slice(from * size..to * size))
                }
                TensorData::Bytes(elements) => TensorData::Bytes(elements[from..to].to_vec()),
            };
            pieces.push(Tensor { dtype: self.dtype, shape, data });
            start += rows;
        }
        Ok(pieces)
    }
}

/// Elements of a block that [`Tensor::write_finite`] scans and then hands on.
const WRITE_BLOCK_ELEMENTS: usize = 8192;

/// The first element of `bytes`, elements of `dtype`, that is NaN or infinite: its index and value.
fn first_non_finite_in(dtype: DataType, bytes: &[u8]) -> Option<(usize, f64)> {
    use half::{bf16, f16};
    // A float is NaN or infinite where its exponent bits are all set: tested on the bits, a block at a time
    // without stopping (the compiler makes that a vector loop), and element by element in the one block that
    // has such a value. Inputs and outputs of many MiB are scanned on every request.
    let found = match dtype {
        DataType::Fp16 => first_with(bytes, |w: u16| w & 0x7c00 == 0x7c00),
        DataType::Bf16 => first_with(bytes, |w: u16| w & 0x7f80 == 0x7f80),
        DataType::Fp32 => first_with(bytes, |w: u32| w & 0x7f80_0000 == 0x7f80_0000),
        DataType::Fp64 => first_with(bytes, |w: u64| w & 0x7ff0_0000_0000_0000 == 0x7ff0_0000_0000_0000),
        _ => None,
    }?;
    let b = &bytes[found * dtype.size()?..];
    let value = match dtype {
        DataType::Fp16 => f16::get(&b[..2]).to_f64(),
        DataType::Bf16 => bf16::get(&b[..2]).to_f64(),
        DataType::Fp32 => f64::from(f32::get(&b[..4])),
        _ => f64::get(&b[..8]),
    };
    Some((found, value))
}

/// The index of the first `N`-byte element of `bytes` for which `bad` holds.
fn first_with<W: Element>(bytes: &[u8], bad: impl Fn(W) -> bool) -> Option<usize> {
    // Read as words in place where they can be (the compiler's vector loop then loads them whole); else each
    // element's bytes are put together.
    match W::view(bytes) {
        Some(words) => first_in_blocks(words.chunks(SCAN_BLOCK), |block| block.iter().copied(), bad),
        None => first_in_blocks(bytes.chunks(SCAN_BLOCK * W::SIZE), |b| b.chunks_exact(W::SIZE).map(W::get), bad),
    }
}

/// Elements a block of the NaN scan holds.
const SCAN_BLOCK: usize = 512;

/// The index of the first element that is `bad`, over blocks of [`SCAN_BLOCK`] elements each: a block is tested
/// whole, without stopping, and searched element by element only where it has one.
fn first_in_blocks<B: Copy, W, I: Iterator<Item = W>>(
    blocks: impl Iterator<Item = B>,
    elements: impl Fn(B) -> I,
    bad: impl Fn(W) -> bool,
) -> Option<usize> {
    blocks.enumerate().find_map(|(b, block)| {
        let any = elements(block).fold(false, |any, w| any | bad(w));
        any.then(|| elements(block).position(&bad).map(|i| b * SCAN_BLOCK + i)).flatten()
    })
}

#[cfg(test)]
#[path = "tensor_tests.rs"]
mod tests;
