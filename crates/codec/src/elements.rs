//! Single tensor elements in JSON: each number, boolean or string checked against its tensor's data type and
//! appended as typed little-endian bytes, and each element written back as a JSON value.

use std::fmt;

use inferd_core::half::{bf16, f16};
use inferd_core::{DataType, Element, Tensor, TensorSpec};
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::{Serialize, Serializer};

use super::{quoted, CodecError};

/// The decoded elements of one tensor so far, as typed little-endian bytes (or byte strings for `BYTES`).
pub(crate) struct Elements<'a> {
    pub spec: &'a TensorSpec,
    bytes: Vec<u8>,
    strings: Vec<Vec<u8>>,
    pub count: usize,
    /// The most elements the tensor may hold: one more is refused as it arrives.
    cap: usize,
}

impl<'a> Elements<'a> {
    pub fn new(spec: &'a TensorSpec, cap: usize) -> Self {
        Elements { spec, bytes: Vec::new(), strings: Vec::new(), count: 0, cap }
    }

    fn counted<E: de::Error>(&mut self) -> Result<(), E> {
        self.count += 1;
        if self.count > self.cap {
            return Err(E::custom(format!(
                "input `{}`: more elements than its shape holds ({})",
                quoted(&self.spec.name),
                self.cap
            )));
        }
        Ok(())
    }

    pub fn into_tensor(self, shape: Vec<usize>) -> Result<Tensor, CodecError> {
        let tensor = if self.spec.datatype == DataType::Bytes {
            Tensor::from_byte_strings(shape, self.strings)
        } else {
            Tensor::new(self.spec.datatype, shape, self.bytes)
        };
        tensor.map_err(|e| CodecError::Invalid(format!("input `{}`: {e}", quoted(&self.spec.name))))
    }

    /// Room for `elements` more, where their count is known (or bounded) before they are read.
    pub fn reserve(&mut self, elements: usize) {
        self.bytes.reserve(elements.saturating_mul(self.spec.datatype.size().unwrap_or(0)));
    }

    /// Where a reader that checks each value itself (finite as FP32) appends FP32 elements, counting them into
    /// [`Elements::count`]: `None` for a tensor of another type, or one with a cap.
    pub fn fp32_bytes(&mut self) -> Option<&mut Vec<u8>> {
        (self.spec.datatype == DataType::Fp32 && self.cap == usize::MAX).then_some(&mut self.bytes)
    }

    #[inline]
    pub fn number<E: de::Error>(&mut self, n: Number) -> Result<(), E> {
        // FP32, the most common, inline: what the general path below stores for it, without its checks and calls
        // for every data type (a third of a plain body's decoding). Out of range, or past the cap, it refuses.
        if self.spec.datatype == DataType::Fp32 && self.count < self.cap {
            let v = n.as_f64() as f32;
            if v.is_finite() {
                self.count += 1;
                v.put(&mut self.bytes);
                return Ok(());
            }
        }
        self.any_number(n)
    }

    #[inline(never)]
    fn any_number<E: de::Error>(&mut self, n: Number) -> Result<(), E> {
        self.counted()?;
        let spec = self.spec;
        let out = &mut self.bytes;
        let float = |v: f64| -> Result<f64, E> {
            if v.is_finite() {
                Ok(v)
            } else {
                Err(E::custom(format!(
                    "input `{}`: {} is out of range for {}",
                    quoted(&spec.name),
                    n.as_f64(),
                    spec.datatype
                )))
            }
        };
        match spec.datatype {
            DataType::Fp32 => (float(f64::from(n.as_f64() as f32))? as f32).put(out),
            DataType::Fp64 => float(n.as_f64())?.put(out),
            DataType::Fp16 => f16::from_f64(float(f16::from_f64(n.as_f64()).to_f64())?).put(out),
            DataType::Bf16 => bf16::from_f64(float(bf16::from_f64(n.as_f64()).to_f64())?).put(out),
            DataType::Uint8 => integer::<u8, E>(spec, n)?.put(out),
            DataType::Uint16 => integer::<u16, E>(spec, n)?.put(out),
            DataType::Uint32 => integer::<u32, E>(spec, n)?.put(out),
            DataType::Uint64 => integer::<u64, E>(spec, n)?.put(out),
            DataType::Int8 => integer::<i8, E>(spec, n)?.put(out),
            DataType::Int16 => integer::<i16, E>(spec, n)?.put(out),
            DataType::Int32 => integer::<i32, E>(spec, n)?.put(out),
            DataType::Int64 => integer::<i64, E>(spec, n)?.put(out),
            DataType::Bool => {
                return Err(E::custom(format!("input `{}` is BOOL: send true or false", quoted(&spec.name))))
            }
            DataType::Bytes => return Err(E::custom(format!("input `{}` is BYTES: send strings", quoted(&spec.name)))),
        }
        Ok(())
    }

    fn boolean<E: de::Error>(&mut self, v: bool) -> Result<(), E> {
        if self.spec.datatype != DataType::Bool {
            return Err(de::Error::invalid_type(de::Unexpected::Bool(v), &Expecting(self)));
        }
        self.counted()?;
        v.put(&mut self.bytes);
        Ok(())
    }

    fn string<E: de::Error>(&mut self, v: &str) -> Result<(), E> {
        if self.spec.datatype != DataType::Bytes {
            return Err(de::Error::invalid_type(de::Unexpected::Str(v), &Expecting(self)));
        }
        self.counted()?;
        self.strings.push(v.as_bytes().to_vec());
        Ok(())
    }

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = self.spec;
        let what = match spec.datatype {
            DataType::Bool => "true or false",
            DataType::Bytes => "a string",
            _ => "a number",
        };
        write!(f, "{what} (an element of input `{}`, {} {:?})", quoted(&spec.name), spec.datatype, spec.shape)
    }
}

/// A JSON number as serde_json gives it to a visitor.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Number {
    I(i64),
    U(u64),
    F(f64),
}

impl Number {
    fn as_f64(self) -> f64 {
        match self {
            Number::I(v) => v as f64,
            Number::U(v) => v as f64,
            Number::F(v) => v,
        }
    }

    /// The value as an integer, if it is one (`3.0` is).
    fn as_integer(self) -> Option<i128> {
        match self {
            Number::I(v) => Some(i128::from(v)),
            Number::U(v) => Some(i128::from(v)),
            Number::F(v) if v.fract() == 0.0 && v.abs() < 1.8e19 => Some(v as i128),
            Number::F(_) => None,
        }
    }
}

fn integer<T: TryFrom<i128>, E: de::Error>(spec: &TensorSpec, n: Number) -> Result<T, E> {
    n.as_integer().and_then(|i| T::try_from(i).ok()).ok_or_else(|| {
        E::custom(format!("input `{}`: {} is not a {} value", quoted(&spec.name), n.as_f64(), spec.datatype))
    })
}

/// One element; or, where `nested` (a v2 `data` array, read in row-major order), an array of them at any depth.
pub(crate) struct ElementSeed<'s, 'a> {
    pub elements: &'s mut Elements<'a>,
    pub nested: bool,
}

impl<'de> DeserializeSeed<'de> for ElementSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ElementSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nested {
            f.write_str("an array of ")?;
        }
        self.elements.expecting(f)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if !self.nested {
            // In /predict the nesting is the shape: an array here is one dimension too many.
            return Err(de::Error::invalid_type(de::Unexpected::Seq, &self));
        }
        while seq.next_element_seed(ElementSeed { elements: &mut *self.elements, nested: true })?.is_some() {}
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.elements.number(Number::I(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.elements.number(Number::U(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.elements.number(Number::F(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.elements.boolean(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.elements.string(v)
    }
}

/// What a tensor's elements are expected to be, for serde's type errors.
struct Expecting<'s, 'a>(&'s Elements<'a>);

impl de::Expected for Expecting<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }
}

/// Element `index` of a tensor as a JSON value (FP16/BF16 as numbers, BYTES as strings).
pub(crate) struct ElementJson<'a> {
    pub tensor: &'a Tensor,
    pub index: usize,
}

impl Serialize for ElementJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.tensor;
        if let Some(strings) = t.byte_strings() {
            return s.serialize_str(&String::from_utf8_lossy(&strings[self.index]));
        }
        let size = t.dtype().size().unwrap_or(1);
        let b = &t.raw_bytes().unwrap_or_default()[self.index * size..(self.index + 1) * size];
        match t.dtype() {
            DataType::Bool => s.serialize_bool(bool::get(b)),
            DataType::Uint8 => s.serialize_u8(u8::get(b)),
            DataType::Uint16 => s.serialize_u16(u16::get(b)),
            DataType::Uint32 => s.serialize_u32(u32::get(b)),
            DataType::Uint64 => s.serialize_u64(u64::get(b)),
            DataType::Int8 => s.serialize_i8(i8::get(b)),
            DataType::Int16 => s.serialize_i16(i16::get(b)),
            DataType::Int32 => s.serialize_i32(i32::get(b)),
            DataType::Int64 => s.serialize_i64(i64::get(b)),
            DataType::Fp16 => float(s, f64::from(f16::get(b).to_f32())),
            DataType::Fp32 => float(s, f64::from(f32::get(b))),
            DataType::Fp64 => float(s, f64::get(b)),
            DataType::Bf16 => float(s, f64::from(bf16::get(b).to_f32())),
            DataType::Bytes => s.serialize_unit(),
        }
    }
}

/// A float as JSON. JSON has no NaN or infinities: where they are allowed out (`--allow-non-finite`), they are the
/// strings "NaN", "Infinity" and "-Infinity", never `null`.
fn float<S: Serializer>(s: S, v: f64) -> Result<S::Ok, S::Error> {
    match v {
        v if v.is_nan() => s.serialize_str("NaN"),
        f64::INFINITY => s.serialize_str("Infinity"),
        f64::NEG_INFINITY => s.serialize_str("-Infinity"),
        // As f32 where it is exact, so that an FP32 value prints as its shortest f32 form (0.1, not 0.100000001…).
        v if f64::from(v as f32) == v => s.serialize_f32(v as f32),
        v => s.serialize_f64(v),
    }
}
