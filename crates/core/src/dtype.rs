//! Element data types: the KServe v2 names, their sizes, and the Rust types that carry them.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A tensor element type, named as in KServe v2 / Triton.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bf16,
    /// Variable-length byte strings.
    Bytes,
}

impl DataType {
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bf16,
        DataType::Bytes,
    ];

    /// The KServe v2 name (`"FP32"`).
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bf16 => "BF16",
            DataType::Bytes => "BYTES",
        }
    }

    /// Bytes per element; `None` for `BYTES`, whose elements vary in length.
    pub fn size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => Some(1),
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => Some(2),
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => Some(4),
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => Some(8),
            DataType::Bytes => None,
        }
    }

    /// True for FP16, FP32, FP64 and BF16.
    pub fn is_float(self) -> bool {
        matches!(self, DataType::Fp16 | DataType::Fp32 | DataType::Fp64 | DataType::Bf16)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a data type name that is not one of the KServe v2 names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown datatype `{0}` (expected one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16, BYTES)")]
pub struct UnknownDataType(pub String);

impl FromStr for DataType {
    type Err = UnknownDataType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DataType::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| UnknownDataType(s.to_owned()))
    }
}

impl Serialize for DataType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for DataType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A Rust type that stores one element of a fixed-size [`DataType`], little-endian.
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + bytemuck::NoUninit + 'static {
    const DTYPE: DataType;
    /// Bytes per element, as `DTYPE.size()`.
    const SIZE: usize;
    /// Appends this element's little-endian bytes.
    fn put(self, out: &mut Vec<u8>);
    /// Reads one element from exactly `SIZE` little-endian bytes.
    fn get(bytes: &[u8]) -> Self;
    /// Little-endian `bytes` seen as elements, without a copy: `None` where they are not aligned for `Self`, where
    /// this machine is big-endian, or where some bytes would not be valid elements (`bool`).
    fn view(bytes: &[u8]) -> Option<&[Self]>;
}

/// The little-endian bytes of `values`: borrowed where this machine is little-endian, else copied.
pub fn le_bytes<T: Element>(values: &[T]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(values))
    } else {
        let mut out = Vec::with_capacity(std::mem::size_of_val(values));
        values.iter().for_each(|v| v.put(&mut out));
        std::borrow::Cow::Owned(out)
    }
}

macro_rules! numeric_element {
    ($($t:ty => $dtype:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn get(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(bytes);
                <$t>::from_le_bytes(raw)
            }
            #[inline]
            fn view(bytes: &[u8]) -> Option<&[Self]> {
                if cfg!(target_endian = "little") {
                    bytemuck::try_cast_slice(bytes).ok()
                } else {
                    None
                }
            }
        }
    )*};
}

numeric_element!(
    u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64,
    i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    f16 => Fp16, f32 => Fp32, f64 => Fp64, bf16 => Bf16,
);

impl Element for bool {
    const DTYPE: DataType = DataType::Bool;
    const SIZE: usize = 1;
    #[inline]
    fn put(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    #[inline]
    fn get(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    #[inline]
    fn view(_: &[u8]) -> Option<&[Self]> {
        // A byte other than 0 or 1 is not a `bool`.
        None
    }
}

/// Runs `$body` with `$T` bound to the [`Element`] type of a fixed-size `$dtype`, or evaluates `$bytes` for
/// `BYTES`. One place that maps data types to Rust types, for every crate that needs typed data.
#[macro_export]
macro_rules! with_element_type {
    ($dtype:expr, $T:ident => $body:expr, BYTES => $bytes:expr $(,)?) => {
        match $dtype {
            $crate::DataType::Bool => {
                type $T = bool;
                $body
            }
            $crate::DataType::Uint8 => {
                type $T = u8;
                $body
            }
            $crate::DataType::Uint16 => {
                type $T = u16;
                $body
            }
            $crate::DataType::Uint32 => {
                type $T = u32;
                $body
            }
            $crate::DataType::Uint64 => {
                type $T = u64;
                $body
            }
            $crate::DataType::Int8 => {
                type $T = i8;
                $body
            }
            $crate::DataType::Int16 => {
                type $T = i16;
                $body
            }
            $crate::DataType::Int32 => {
                type $T = i32;
                $body
            }
            $crate::DataType::Int64 => {
                type $T = i64;
                $body
            }
            $crate::DataType::Fp16 => {
                type $T = $crate::half::f16;
                $body
            }
            $crate::DataType::Fp32 => {
                type $T = f32;
                $body
            }
            $crate::DataType::Fp64 => {
                type $T = f64;
                $body
            }
            $crate::DataType::Bf16 => {
                type $T = $crate::half::bf16;
                $body
            }
            $crate::DataType::Bytes => $bytes,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_the_rust_types() {
        for dtype in DataType::ALL {
            assert_eq!(dtype.as_str().parse::<DataType>(), Ok(dtype));
            let size = with_element_type!(dtype, T => Some(<T as Element>::SIZE), BYTES => None);
            assert_eq!(size, dtype.size(), "{dtype}");
            let element_dtype = with_element_type!(dtype, T => Some(<T as Element>::DTYPE), BYTES => None);
            assert_eq!(element_dtype.unwrap_or(DataType::Bytes), dtype);
        }
    }

    #[test]
    fn unknown_names_are_refused_with_the_list() {
        let err = "FLOAT".parse::<DataType>().expect_err("not a KServe name");
        assert!(err.to_string().contains("unknown datatype `FLOAT`"), "{err}");
        assert!("fp32".parse::<DataType>().is_err(), "names are case-sensitive, as in KServe v2");
    }

    #[test]
    fn elements_are_little_endian() {
        let mut out = Vec::new();
        1.5f32.put(&mut out);
        (-2i16).put(&mut out);
        true.put(&mut out);
        assert_eq!(out, [0x00, 0x00, 0xc0, 0x3f, 0xfe, 0xff, 0x01]);
        assert_eq!(f32::get(&out[0..4]), 1.5);
        assert_eq!(i16::get(&out[4..6]), -2);
        assert!(bool::get(&out[6..7]));
    }
}
