//! The plain form's scanner against the serde decoder: whatever the scanner reads, serde reads to the same tensor,
//! bit for bit; what it gives up on, serde answers (a tensor or an error); and the plain bodies servers get are read
//! by the scanner.

use inferd_core::{DataType, Tensor, TensorSpec};

use super::decode;
use crate::predict::decode_serde;
use crate::Limits;

fn spec(datatype: DataType, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: "input".into(), datatype, shape: shape.to_vec(), optional: false }
}

/// Numbers as clients write them, and as serde_json reads each its own way: integers at and past each type's ends,
/// `-0`, fractions, exponents, floats past f32's and f64's range, subnormals, significands past 64 bits, and the
/// malformed.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "0.0",
    "-0.0",
    "1",
    "-1",
    "7",
    "16.0",
    "127",
    "128",
    "-128",
    "-129",
    "255",
    "256",
    "32767",
    "65504",
    "65520",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967296",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
    "0.1",
    "0.2",
    "0.30000000000000004",
    "3.0",
    "2.5",
    "-2.5",
    "1e2",
    "1E+2",
    "1e-2",
    "-1.5e-3",
    "2.5E3",
    "1e0",
    "0e0",
    "0e400",
    "1e22",
    "1e23",
    "9.999999999999999e22",
    "1.7976931348623157e308",
    "1.7976931348623159e308",
    "1e308",
    "1e309",
    "-1e309",
    "4.9e-324",
    "2e-324",
    "1e-400",
    "3.4028235e38",
    "3.4028236e38",
    "3.5e38",
    "1.4e-45",
    "0.000001",
    "123.456",
    "1.00000000000000000001",
    "0.1234567890123456789",
    "12345678901234567890e-10",
    "5e-1",
    "1e2147483647",
    "1e2147483648",
    "1e-2147483649",
    "01",
    "00",
    "1.",
    ".5",
    "+1",
    "1e",
    "1e+",
    "-",
    "--1",
    "1.5.5",
    "1e5e5",
    "NaN",
    "Infinity",
    "true",
    "null",
    "\"1\"",
    "1x",
];

const TYPES: &[DataType] = &[
    DataType::Fp32,
    DataType::Fp64,
    DataType::Fp16,
    DataType::Bf16,
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::Uint8,
    DataType::Uint16,
    DataType::Uint32,
    DataType::Uint64,
    DataType::Bool,
];

/// The cases, from a seeded generator: the same on every run.
struct Cases(fastrand::Rng);

impl Cases {
    fn new(seed: u64) -> Self {
        Cases(fastrand::Rng::with_seed(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.usize(..n)
    }

    /// A number: one of [`NUMBERS`], or a random float or integer written as Python and JavaScript write them.
    fn number(&mut self) -> String {
        match self.below(4) {
            0 => f64::from_bits(self.next()).to_string(),
            1 => format!("{:e}", f32::from_bits(self.next() as u32)),
            2 => ((self.next() as i64) >> self.below(64)).to_string(),
            _ => NUMBERS[self.below(NUMBERS.len())].to_string(),
        }
    }

    fn space(&mut self) -> &'static str {
        [" ", "", "", "\n  ", "\t", "\r\n"][self.below(6)]
    }
}

/// Asserts that where the scanner reads `body`, serde reads the same tensor; returns whether the scanner read it.
fn agree(body: &str, specs: &[TensorSpec], limits: &Limits) -> bool {
    let serde = decode_serde(body.as_bytes(), specs, limits);
    let Some(plain) = decode(body.as_bytes(), specs, limits) else { return false };
    let serde: Vec<Option<Tensor>> = serde.unwrap_or_else(|e| panic!("the scanner read {body:?}, serde refused: {e}"));
    let serde = serde.into_iter().next().flatten().expect("one input");
    assert_eq!(plain.dtype(), serde.dtype(), "{body}");
    assert_eq!(plain.shape(), serde.shape(), "{body}");
    assert_eq!(plain.raw_bytes(), serde.raw_bytes(), "{body}: the elements differ");
    true
}

#[test]
fn what_the_scanner_reads_serde_reads_to_the_same_bits() {
    let mut cases = Cases::new(0x9e37_79b9_7f4a_7c15);
    let mut read = 0;
    for round in 0..20_000 {
        let datatype = TYPES[round % TYPES.len()];
        let (rows, width) = (1 + cases.below(3), 1 + cases.below(4));
        let mut body = format!("{}{{{}\"input\"{}:{}[", cases.space(), cases.space(), cases.space(), cases.space());
        for r in 0..rows {
            body += if r == 0 { "" } else { "," };
            body += &format!("{}[", cases.space());
            // Now and then a row one short, to be ragged.
            let n = if cases.below(50) == 0 { width.saturating_sub(1).max(1) } else { width };
            for i in 0..n {
                let sep = if i == 0 { "" } else { "," };
                body += &format!("{sep}{}{}{}", cases.space(), cases.number(), cases.space());
            }
            body += "]";
        }
        body += &format!("]{}}}{}", cases.space(), cases.space());
        let shape = if cases.below(2) == 0 { [-1, width as i64] } else { [rows as i64, -1] };
        read += usize::from(agree(&body, &[spec(datatype, &shape)], &Limits::NONE));
    }
    // Most bodies hold some number their type refuses; a tenth is plenty, and the count is the same on every run.
    assert!(read > 1_500, "the scanner read only {read} of 20,000 bodies");
}

#[test]
fn each_number_reads_as_serde_reads_it_in_every_type() {
    let mut cases = Cases::new(0x2545_f491_4f6c_dd1d);
    let numbers: Vec<String> =
        NUMBERS.iter().map(|n| n.to_string()).chain((0..30_000).map(|_| cases.number())).collect();
    for datatype in TYPES {
        let specs = [spec(*datatype, &[-1, 1])];
        let read = numbers.iter().filter(|n| agree(&format!(r#"{{"input": [[{n}]]}}"#), &specs, &Limits::NONE)).count();
        if matches!(datatype, DataType::Fp32 | DataType::Fp64 | DataType::Fp16 | DataType::Bf16) {
            assert!(read > numbers.len() / 3, "{datatype}: the scanner read only {read} of {}", numbers.len());
        }
    }
}

#[test]
fn the_plain_bodies_servers_get_are_read_by_the_scanner() {
    let digits = spec(DataType::Fp32, &[-1, 64]);
    let row = (0..64).map(|i| format!("{}.0", i % 17)).collect::<Vec<_>>().join(", ");
    for body in [
        format!(r#"{{"input": [[{row}]]}}"#),
        format!("{{\"input\":[[{row}],[{row}]]}}\n"),
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/request.json"))
            .expect("the digits request"),
    ] {
        assert!(agree(&body, std::slice::from_ref(&digits), &Limits::NONE), "{body}");
    }
    let ints = spec(DataType::Int64, &[-1, 2, 2]);
    assert!(agree(r#"{"input": [[[1, -2], [3, 4]], [[5, 6], [7, -9223372036854775808]]]}"#, &[ints], &Limits::NONE));
}

#[test]
fn the_scanner_gives_the_rest_to_serde() {
    let one = [spec(DataType::Fp32, &[-1, 2])];
    for body in [
        r#"{"inputs": {"input": [[1, 2]]}}"#,
        r#"{"input": [[1, 2]], "input": [[3, 4]]}"#,
        r#"{"input": [[1, 2]], "id": 1}"#,
        r#"{"\u0069nput": [[1, 2]]}"#,
        r#"{"input": [[1, 2], [3]]}"#,
        r#"{"input": [[1, 2, 3]]}"#,
        r#"{"input": []}"#,
        r#"{"input": [[]]}"#,
        r#"{"input": [[1, "2"]]}"#,
        r#"{"input": [[1, 2]]} x"#,
        r#"{"input": [[1, 2],]}"#,
        r#"{"input": [[1e39, 2]]}"#,
    ] {
        assert!(decode(body.as_bytes(), &one, &Limits::NONE).is_none(), "{body}");
    }
    let two = [spec(DataType::Fp32, &[-1, 2]), spec(DataType::Fp32, &[-1, 2])];
    assert!(decode(br#"{"input": [[1, 2]]}"#, &two, &Limits::NONE).is_none(), "a model of two inputs");
}

#[test]
fn a_body_past_a_limit_is_left_to_serde_and_its_error() {
    let specs = [spec(DataType::Fp32, &[-1, 2])];
    let body = br#"{"input": [[1, 2], [3, 4], [5, 6]]}"#;
    let rows = Limits { max_rows: 2, ..Limits::NONE };
    let elements = Limits { max_elements: 5, ..Limits::NONE };
    let depth = Limits { max_json_depth: 2, ..Limits::NONE };
    for limits in [rows, elements, depth] {
        assert!(decode(body, &specs, &limits).is_none());
        assert!(crate::predict::decode_predict(body, &specs, &limits).is_err(), "{limits:?}");
    }
    let at_the_limits = Limits { max_rows: 3, max_elements: 6, max_json_depth: 3 };
    assert!(agree(std::str::from_utf8(body).expect("text"), &specs, &at_the_limits));
}

#[test]
fn nesting_past_serde_jsons_own_limit_is_left_to_serde() {
    // serde_json refuses arrays nested past 128 levels whatever the server's limit: so does the scanner.
    let rank = 127;
    let specs = [spec(DataType::Fp32, &vec![1; rank])];
    let body = format!(r#"{{"input": {}1{}}}"#, "[".repeat(rank), "]".repeat(rank));
    assert!(decode(body.as_bytes(), &specs, &Limits::NONE).is_none());
    assert!(decode_serde(body.as_bytes(), &specs, &Limits::NONE).is_err(), "serde_json's own limit");
    let shallower = [spec(DataType::Fp32, &vec![1; rank - 1])];
    let body = format!(r#"{{"input": {}1{}}}"#, "[".repeat(rank - 1), "]".repeat(rank - 1));
    assert!(agree(&body, &shallower, &Limits::NONE), "126 arrays in the object: within serde_json's limit");
}
