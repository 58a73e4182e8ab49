//! JSON tensors: request bodies decoded straight into typed bytes (checking names, dimensions and element types
//! as they stream by, so nothing is allocated beyond what the body holds), and tensors written back as nested
//! arrays.

use std::fmt;

use inferd_core::half::{bf16, f16};
use inferd_core::{DataType, Element, Tensor, TensorSpec};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

/// Decodes a `/predict` body, `{"input": [...]}` or `{"inputs": {"name": [...], ...}}`, into one tensor per
/// spec, in the specs' order.
pub fn decode_predict(body: &[u8], specs: &[TensorSpec]) -> Result<Vec<Tensor>, String> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let tensors = BodySeed { specs }.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(tensors)
}

/// Refuses JSON that nests arrays and objects deeper than `max`, before anything parses it. Brackets inside
/// strings do not count.
pub fn check_json_depth(json: &[u8], max: usize) -> Result<(), String> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(format!("the JSON nests deeper than {max} levels (--max-json-depth)"));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// The names of `specs`, quoted, for messages.
pub(crate) fn names(specs: &[TensorSpec]) -> String {
    specs.iter().map(|s| format!("`{}`", s.name)).collect::<Vec<_>>().join(", ")
}

struct BodySeed<'a> {
    specs: &'a [TensorSpec],
}

impl<'de> DeserializeSeed<'de> for BodySeed<'_> {
    type Value = Vec<Tensor>;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_> {
    type Value = Vec<Tensor>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with `input` (an array) or `inputs` (an object of named arrays)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let specs = self.specs;
        let mut slots: Vec<Option<Tensor>> = vec![None; specs.len()];
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "input" => {
                    if specs.len() != 1 {
                        return Err(de::Error::custom(format!(
                            "this model takes {} inputs ({}): send them by name in `inputs`",
                            specs.len(),
                            names(specs)
                        )));
                    }
                    if slots[0].is_some() {
                        return Err(de::Error::custom(format!("input `{}` is given twice", specs[0].name)));
                    }
                    slots[0] = Some(map.next_value_seed(TensorSeed { spec: &specs[0] })?);
                }
                "inputs" => map.next_value_seed(NamedInputsSeed { specs, slots: &mut slots })?,
                other => {
                    return Err(de::Error::custom(format!("unknown field `{other}`: expected `input` or `inputs`")))
                }
            }
        }
        specs
            .iter()
            .zip(slots)
            .map(|(spec, slot)| slot.ok_or_else(|| de::Error::custom(format!("missing input `{}`", spec.name))))
            .collect()
    }
}

struct NamedInputsSeed<'a, 's> {
    specs: &'a [TensorSpec],
    slots: &'s mut [Option<Tensor>],
}

impl<'de> DeserializeSeed<'de> for NamedInputsSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for NamedInputsSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an object of named inputs ({})", names(self.specs))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            let Some(i) = self.specs.iter().position(|s| s.name == name) else {
                return Err(de::Error::custom(format!(
                    "this model has no input `{name}` (it takes {})",
                    names(self.specs)
                )));
            };
            if self.slots[i].is_some() {
                return Err(de::Error::custom(format!("input `{name}` is given twice")));
            }
            self.slots[i] = Some(map.next_value_seed(TensorSeed { spec: &self.specs[i] })?);
        }
        Ok(())
    }
}

/// Decodes one nested array into a tensor of `spec`'s type, checking each dimension as it closes.
struct TensorSeed<'a> {
    spec: &'a TensorSpec,
}

/// What a tensor's nested arrays have filled in so far.
struct Fill<'a> {
    spec: &'a TensorSpec,
    /// Each dimension's length, known once its first array closes.
    dims: Vec<Option<usize>>,
    sink: Sink<'a>,
}

/// Decoded elements of one tensor, as typed little-endian bytes (or byte strings for `BYTES`).
struct Sink<'a> {
    spec: &'a TensorSpec,
    bytes: Vec<u8>,
    strings: Vec<Vec<u8>>,
    count: usize,
    /// Elements allowed at most.
    limit: usize,
}

impl<'a> Sink<'a> {
    fn new(spec: &'a TensorSpec, limit: usize) -> Self {
        Sink { spec, bytes: Vec::new(), strings: Vec::new(), count: 0, limit }
    }

    fn counted<E: de::Error>(&mut self) -> Result<(), E> {
        self.count += 1;
        if self.count > self.limit {
            return Err(E::custom(format!(
                "input `{}`: more elements than its shape holds ({})",
                self.spec.name, self.limit
            )));
        }
        Ok(())
    }

    fn into_tensor(self, shape: Vec<usize>) -> Result<Tensor, String> {
        let tensor = if self.spec.datatype == DataType::Bytes {
            Tensor::from_byte_strings(shape, self.strings)
        } else {
            Tensor::new(self.spec.datatype, shape, self.bytes)
        };
        tensor.map_err(|e| format!("input `{}`: {e}", self.spec.name))
    }
}

impl<'de> DeserializeSeed<'de> for TensorSeed<'_> {
    type Value = Tensor;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Tensor, D::Error> {
        let spec = self.spec;
        let mut fill = Fill { spec, dims: vec![None; spec.shape.len()], sink: Sink::new(spec, usize::MAX) };
        LevelSeed { depth: 0, fill: &mut fill }.deserialize(deserializer)?;
        // Every level closed at least once (empty levels were refused), so every dimension is known.
        let shape: Vec<usize> = fill.dims.iter().map(|d| d.unwrap_or(0)).collect();
        fill.sink.into_tensor(shape).map_err(de::Error::custom)
    }
}

struct LevelSeed<'f, 'a> {
    depth: usize,
    fill: &'f mut Fill<'a>,
}

impl<'de> DeserializeSeed<'de> for LevelSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for LevelSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = self.fill.spec;
        write!(
            f,
            "input `{}` as a nested array of {} dimensions ({} {:?})",
            spec.name,
            spec.shape.len(),
            spec.datatype,
            spec.shape
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Self { depth, fill } = self;
        let spec = fill.spec;
        let fixed = usize::try_from(spec.shape[depth]).ok();
        // A dimension's length is fixed by the spec, or by the first array seen at this depth.
        let limit = fixed.or(fill.dims[depth]);
        let innermost = depth + 1 == spec.shape.len();
        let mut n = 0usize;
        loop {
            let more = if innermost {
                seq.next_element_seed(ElementSeed { sink: &mut fill.sink, nested: false })?
            } else {
                seq.next_element_seed(LevelSeed { depth: depth + 1, fill: &mut *fill })?
            };
            if more.is_none() {
                break;
            }
            n += 1;
            if limit.is_some_and(|l| n > l) {
                return Err(de::Error::custom(dimension_error(spec, depth, limit, fixed)));
            }
        }
        if n == 0 {
            return Err(de::Error::custom(if depth == 0 {
                format!("input `{}` has no rows", spec.name)
            } else {
                format!("input `{}`: dimension {depth} is empty", spec.name)
            }));
        }
        match limit {
            Some(l) if l != n => Err(de::Error::custom(dimension_error(spec, depth, limit, fixed))),
            _ => {
                fill.dims[depth] = Some(n);
                Ok(())
            }
        }
    }
}

fn dimension_error(spec: &TensorSpec, depth: usize, limit: Option<usize>, fixed: Option<usize>) -> String {
    match (fixed, limit) {
        (Some(f), _) => {
            format!("input `{}`: dimension {depth} must have {f} elements (shape {:?})", spec.name, spec.shape)
        }
        _ => format!(
            "input `{}`: arrays at dimension {depth} differ in length (ragged); every row needs {} elements",
            spec.name,
            limit.unwrap_or(0)
        ),
    }
}

/// One element; or, where `nested` (a v2 `data` array, read in row-major order), an array of them at any depth.
struct ElementSeed<'s, 'a> {
    sink: &'s mut Sink<'a>,
    nested: bool,
}

impl<'de> DeserializeSeed<'de> for ElementSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

#[derive(Clone, Copy)]
enum Number {
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

impl Sink<'_> {
    fn number<E: de::Error>(&mut self, n: Number) -> Result<(), E> {
        self.counted()?;
        let spec = self.spec;
        let out = &mut self.bytes;
        let float = |v: f64| -> Result<f64, E> {
            if v.is_finite() {
                Ok(v)
            } else {
                Err(E::custom(format!("input `{}`: {} is out of range for {}", spec.name, n.as_f64(), spec.datatype)))
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
            DataType::Bool => return Err(E::custom(format!("input `{}` is BOOL: send true or false", spec.name))),
            DataType::Bytes => return Err(E::custom(format!("input `{}` is BYTES: send strings", spec.name))),
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
        write!(f, "{what} (an element of input `{}`, {} {:?})", spec.name, spec.datatype, spec.shape)
    }
}

fn integer<T: TryFrom<i128>, E: de::Error>(spec: &TensorSpec, n: Number) -> Result<T, E> {
    n.as_integer()
        .and_then(|i| T::try_from(i).ok())
        .ok_or_else(|| E::custom(format!("input `{}`: {} is not a {} value", spec.name, n.as_f64(), spec.datatype)))
}

impl<'de> Visitor<'de> for ElementSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nested {
            f.write_str("an array of ")?;
        }
        self.sink.expecting(f)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if !self.nested {
            // In /predict the nesting is the shape: an array here is one dimension too many.
            return Err(de::Error::invalid_type(de::Unexpected::Seq, &self));
        }
        while seq.next_element_seed(ElementSeed { sink: &mut *self.sink, nested: true })?.is_some() {}
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.sink.number(Number::I(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.sink.number(Number::U(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.sink.number(Number::F(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.sink.boolean(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.sink.string(v)
    }
}

/// A sink's description of what it expects, for serde's type errors.
struct Expecting<'s, 'a>(&'s Sink<'a>);

impl de::Expected for Expecting<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }
}

/// Decodes a KServe v2 `data` field, flat or nested (read in row-major order), into a tensor of `spec`'s type
/// and the request's `shape`. The elements must be exactly as many as the shape holds; more are refused as they
/// arrive, so nothing is allocated beyond what the body carries.
pub fn decode_flat(data: &str, spec: &TensorSpec, shape: Vec<usize>) -> Result<Tensor, String> {
    let expected = inferd_core::element_count(&shape).map_err(|e| format!("input `{}`: {e}", spec.name))?;
    let mut sink = Sink::new(spec, expected);
    let mut de = serde_json::Deserializer::from_str(data);
    ElementSeed { sink: &mut sink, nested: true }.deserialize(&mut de).map_err(|e| e.to_string())?;
    if sink.count != expected {
        return Err(format!(
            "input `{}`: `data` holds {} elements, but shape {shape:?} needs {expected}",
            spec.name, sink.count
        ));
    }
    sink.into_tensor(shape)
}

/// Serializes a tensor as nested JSON arrays (FP16/BF16 as numbers, BYTES as strings).
pub struct NestedJson<'a>(pub &'a Tensor);

impl Serialize for NestedJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.shape().is_empty() {
            return ElementJson { tensor: self.0, index: 0 }.serialize(serializer);
        }
        Level { tensor: self.0, depth: 0, offset: 0 }.serialize(serializer)
    }
}

/// Serializes a tensor's elements as one flat JSON array, as KServe v2 answers.
pub struct FlatJson<'a>(pub &'a Tensor);

impl Serialize for FlatJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let n = self.0.element_count();
        let mut seq = serializer.serialize_seq(Some(n))?;
        for index in 0..n {
            seq.serialize_element(&ElementJson { tensor: self.0, index })?;
        }
        seq.end()
    }
}

struct Level<'a> {
    tensor: &'a Tensor,
    depth: usize,
    /// The index of this level's first element.
    offset: usize,
}

impl Serialize for Level<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let shape = self.tensor.shape();
        let len = shape[self.depth];
        let stride: usize = shape[self.depth + 1..].iter().product();
        let mut seq = serializer.serialize_seq(Some(len))?;
        for i in 0..len {
            let offset = self.offset + i * stride;
            if self.depth + 1 == shape.len() {
                seq.serialize_element(&ElementJson { tensor: self.tensor, index: offset })?;
            } else {
                seq.serialize_element(&Level { tensor: self.tensor, depth: self.depth + 1, offset })?;
            }
        }
        seq.end()
    }
}

struct ElementJson<'a> {
    tensor: &'a Tensor,
    index: usize,
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
            DataType::Fp16 => s.serialize_f32(f16::get(b).to_f32()),
            DataType::Fp32 => s.serialize_f32(f32::get(b)),
            DataType::Fp64 => s.serialize_f64(f64::get(b)),
            DataType::Bf16 => s.serialize_f32(bf16::get(b).to_f32()),
            DataType::Bytes => s.serialize_unit(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, datatype: DataType, shape: &[i64]) -> TensorSpec {
        TensorSpec { name: name.into(), datatype, shape: shape.to_vec() }
    }

    fn digits() -> Vec<TensorSpec> {
        vec![spec("input", DataType::Fp32, &[-1, 3])]
    }

    #[test]
    fn json_depth_counts_arrays_and_objects_but_not_brackets_in_strings() {
        assert!(check_json_depth(br#"{"input": [[1, 2]]}"#, 3).is_ok());
        let err = check_json_depth(br#"{"input": [[[1]]]}"#, 3).expect_err("four levels");
        assert!(err.contains("deeper than 3"), "{err}");
        assert!(check_json_depth(br#"{"id": "[[[[\"[[[", "x": []}"#, 2).is_ok());
        assert!(check_json_depth(&[b'['; 100_000], 32).is_err());
    }

    #[test]
    fn a_single_input_decodes_into_fp32_rows() {
        let t = decode_predict(br#"{"input": [[1, 2.5, 3], [4, 5, 6e0]]}"#, &digits()).expect("valid");
        assert_eq!(t[0].shape(), &[2, 3]);
        assert_eq!(t[0].to_vec::<f32>().expect("fp32"), vec![1.0, 2.5, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn named_inputs_land_in_the_models_order() {
        let specs = vec![spec("a", DataType::Int64, &[-1, 2]), spec("b", DataType::Bool, &[-1])];
        let t = decode_predict(br#"{"inputs": {"b": [true, false], "a": [[1, -2], [3, 4]]}}"#, &specs).expect("valid");
        assert_eq!(t[0].to_vec::<i64>().expect("i64"), vec![1, -2, 3, 4]);
        assert_eq!(t[1].to_vec::<bool>().expect("bool"), vec![true, false]);
    }

    #[test]
    fn fp16_and_bf16_inputs_take_json_numbers() {
        let t =
            decode_predict(br#"{"input": [[0.5, -2, 1024]]}"#, &[spec("x", DataType::Fp16, &[-1, 3])]).expect("valid");
        let values: Vec<f32> = t[0].to_vec::<f16>().expect("fp16").iter().map(|v| v.to_f32()).collect();
        assert_eq!(values, vec![0.5, -2.0, 1024.0]);
        let t = decode_predict(br#"{"input": [[0.5]]}"#, &[spec("x", DataType::Bf16, &[-1, 1])]).expect("valid");
        assert_eq!(t[0].to_vec::<bf16>().expect("bf16")[0].to_f32(), 0.5);
    }

    fn error(body: &str, specs: &[TensorSpec]) -> String {
        decode_predict(body.as_bytes(), specs).expect_err("refused")
    }

    #[test]
    fn bad_bodies_are_refused_with_what_was_wrong() {
        let d = digits();
        let cases = [
            (r#"{"input": [[1, 2]]}"#, "dimension 1 must have 3 elements"),
            (r#"{"input": [[1, 2, 3, 4]]}"#, "dimension 1 must have 3 elements"),
            (r#"{"input": [1, 2, 3]}"#, "nested array of 2 dimensions"),
            (r#"{"input": [[[1], [2], [3]]]}"#, "a number (an element of input `input`"),
            (r#"{"input": [[1, "2", 3]]}"#, "invalid type: string"),
            (r#"{"input": [[1, null, 3]]}"#, "invalid type: null"),
            (r#"{"input": [[1, true, 3]]}"#, "invalid type: boolean"),
            (r#"{"input": []}"#, "has no rows"),
            (r#"{"input": [[]]}"#, "dimension 1 is empty"),
            (r#"{"input": [[1, 2, 1e39]]}"#, "out of range for FP32"),
            (r#"{"inputs": {"image": [[1, 2, 3]]}}"#, "no input `image`"),
            (r#"{"input": [[1, 2, 3]], "input": [[1, 2, 3]]}"#, "given twice"),
            (r#"{"inputz": [[1, 2, 3]]}"#, "unknown field `inputz`"),
            (r#"{}"#, "missing input `input`"),
            (r#"[[1, 2, 3]]"#, "a JSON object with `input`"),
            (r#"{"input": [[1, 2, 3]]"#, "EOF"),
            (r#"{"input": [[1, 2, 3]]} trailing"#, "trailing characters"),
            ("", "EOF"),
        ];
        for (body, expected) in cases {
            let err = error(body, &d);
            assert!(err.contains(expected), "{body}: expected {expected:?} in {err:?}");
        }
    }

    #[test]
    fn ragged_rows_are_refused_where_dimensions_vary() {
        let specs = [spec("x", DataType::Fp32, &[-1, -1])];
        assert!(error(r#"{"input": [[1, 2], [3]]}"#, &specs).contains("ragged"));
        assert!(error(r#"{"input": [[1], [2, 3]]}"#, &specs).contains("ragged"));
        assert_eq!(decode_predict(br#"{"input": [[1, 2], [3, 4]]}"#, &specs).expect("valid")[0].shape(), &[2, 2]);
    }

    #[test]
    fn integers_must_fit_their_type() {
        let specs = [spec("x", DataType::Uint8, &[-1])];
        assert!(error(r#"{"input": [256]}"#, &specs).contains("not a UINT8 value"));
        assert!(error(r#"{"input": [-1]}"#, &specs).contains("not a UINT8 value"));
        assert!(error(r#"{"input": [1.5]}"#, &specs).contains("not a UINT8 value"));
        assert_eq!(
            decode_predict(br#"{"input": [255, 3.0]}"#, &specs).expect("valid")[0].to_vec::<u8>().expect("u8"),
            vec![255, 3]
        );
    }

    #[test]
    fn several_inputs_must_be_named() {
        let specs = vec![spec("a", DataType::Fp32, &[-1]), spec("b", DataType::Fp32, &[-1])];
        assert!(error(r#"{"input": [1]}"#, &specs).contains("send them by name in `inputs`"));
    }

    #[test]
    fn tensors_serialize_as_nested_arrays() {
        let t = Tensor::from_slice(vec![2, 2], &[0.5f32, 1.0, -2.0, 3.25]).expect("valid");
        assert_eq!(serde_json::to_string(&NestedJson(&t)).expect("json"), "[[0.5,1.0],[-2.0,3.25]]");
        let t = Tensor::from_slice(vec![1, 2], &[f16::from_f32(0.5), f16::from_f32(-1.0)]).expect("valid");
        assert_eq!(serde_json::to_string(&NestedJson(&t)).expect("json"), "[[0.5,-1.0]]");
        let t = Tensor::from_slice(vec![3], &[1i64, -2, 3]).expect("valid");
        assert_eq!(serde_json::to_string(&NestedJson(&t)).expect("json"), "[1,-2,3]");
        let t = Tensor::from_byte_strings(vec![1], vec![b"hi".to_vec()]).expect("valid");
        assert_eq!(serde_json::to_string(&NestedJson(&t)).expect("json"), r#"["hi"]"#);
    }
}
