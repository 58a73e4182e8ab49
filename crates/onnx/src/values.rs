//! Tensors to and from ONNX Runtime's values: inputs read in place where they can be, outputs kept where the
//! runtime wrote them.

use std::marker::PhantomData;
use std::sync::Arc;

use inferd_core::{with_element_type, Error, Result, Tensor, TensorSpec};
use ort::session::SessionInputValue;
use ort::value::DynValue;

/// A batch's tensor as a session's input: its own memory where ONNX Runtime can read the elements in place (aligned,
/// little-endian), else a copy.
pub(crate) fn to_ort(t: &Tensor) -> Result<SessionInputValue<'_>> {
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    let value = with_element_type!(t.dtype(), T => match t.as_slice::<T>() {
        Some(elements) => ort::value::TensorRef::<T>::from_array_view((shape, elements)).map(SessionInputValue::from),
        None => ort::value::Tensor::<T>::from_array((shape, t.to_vec::<T>()?)).map(|v| v.into_dyn().into()),
    }, BYTES => {
        let strings = t
            .byte_strings()
            .unwrap_or_default()
            .iter()
            .map(|b| String::from_utf8(b.clone()))
            .collect::<std::result::Result<Vec<String>, _>>()
            .map_err(|_| Error::InvalidInput("a BYTES element is not UTF-8, which ONNX strings must be".into()))?;
        ort::value::Tensor::from_string_array((shape, strings.as_slice())).map(|v| v.into_dyn().into())
    });
    value.map_err(Error::engine)
}

/// A session's output as a tensor. A fixed-size one keeps the elements where ONNX Runtime wrote them, the value (and
/// `session`, whose allocator the memory is ONNX Runtime's to free with) held for as long as the tensor's bytes are
/// (split into a batch's requests, say): no copy of a large output.
pub(crate) fn from_ort(spec: &TensorSpec, value: DynValue, session: &Held) -> Result<Tensor> {
    let dims = |shape: &[i64]| shape.iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect::<Vec<usize>>();
    with_element_type!(spec.datatype, T => {
        let (shape, data) = value.try_extract_tensor::<T>().map_err(Error::engine)?;
        let shape = dims(shape);
        if cfg!(target_endian = "big") {
            return Tensor::from_slice(shape, data);
        }
        let held = OrtBytes::<T> { value, _session: session.clone(), element: PhantomData };
        Tensor::new(spec.datatype, shape, bytes::Bytes::from_owner(held))
    }, BYTES => {
        let (shape, strings) = value.try_extract_strings().map_err(Error::engine)?;
        Tensor::from_byte_strings(dims(shape), strings.into_iter().map(String::into_bytes).collect())
    })
}

/// A session output's elements as little-endian bytes, in place (on a little-endian machine).
struct OrtBytes<T> {
    value: DynValue,
    _session: Held,
    element: PhantomData<T>,
}

/// A session, held for the outputs it gave.
pub(crate) type Held = Arc<ort::session::SharedSessionInner>;

impl<T: inferd_core::Element + ort::value::PrimitiveTensorElementType> AsRef<[u8]> for OrtBytes<T> {
    fn as_ref(&self) -> &[u8] {
        // `from_ort` extracted the value as `T` before it made this.
        self.value.try_extract_tensor::<T>().map_or(&[], |(_, elements)| bytemuck::cast_slice(elements))
    }
}
