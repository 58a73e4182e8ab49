//! The plainest `/predict` body, `{"input": [[1, 2.5, …], …]}` (one input, numbers only), read by a scanner of its
//! own: through serde's visitors a number cost about 450 instructions, a third of a one-row request's on the
//! server. The scanner reads only what the serde decoder reads to the same tensor, bit for bit: numbers are
//! parsed as serde_json parses them (its significand and power of ten, not a correctly rounded parse, where they
//! differ) and stored by the same [`Elements`]. Anything else — another key, a string, an escape, a number that
//! serde_json would read another way (a significand past 64 bits, an exponent past its table), a ragged or empty
//! array, a body past a limit, bad JSON — makes it give up, and the serde decoder reads the body from the start,
//! with its errors and messages.

use std::sync::OnceLock;

use inferd_core::{DataType, Tensor, TensorSpec};

use super::elements::{Elements, Number};
use super::Limits;

/// serde_json's own limit on nesting, arrays and objects together: it refuses this many levels.
const SERDE_DEPTH: usize = 128;

/// The largest body whose elements are counted before they are read, for room for all of them at once.
const RESERVE_BELOW: usize = 64 * 1024;

/// The body's one input, or `None` where the body is not of the plain form (see the module's documentation).
pub(crate) fn decode(body: &[u8], specs: &[TensorSpec], limits: &Limits) -> Option<Tensor> {
    let [spec] = specs else { return None };
    // The nesting: the body's object, then one array a dimension; serde_json itself refuses 128 levels.
    let nesting = spec.shape.len() + 1;
    if spec.shape.is_empty() || nesting > limits.max_json_depth || nesting >= SERDE_DEPTH {
        return None;
    }
    if matches!(spec.datatype, DataType::Bool | DataType::Bytes) {
        return None;
    }
    let mut scan = Scan { body, at: 0 };
    scan.eat(b"{")?;
    scan.eat(b"\"input\"")?;
    scan.eat(b":")?;
    let mut tensor =
        Nested { spec, limits, dims: vec![None; spec.shape.len()], elements: Elements::new(spec, usize::MAX) };
    if body.len() <= RESERVE_BELOW {
        // Every element but the last is followed by a comma: room for all of them at once. Only for small bodies,
        // where a body that turns out not to be plain has reserved little; a large one grows as it is read.
        let commas: usize = body.iter().map(|&b| usize::from(b == b',')).sum();
        tensor.elements.reserve(commas.saturating_add(1).min(limits.max_elements));
    }
    tensor.level(&mut scan, 0)?;
    scan.eat(b"}")?;
    scan.skip_space();
    if scan.at != body.len() {
        return None;
    }
    let shape = tensor.dims.iter().map(|d| d.unwrap_or(0)).collect();
    tensor.elements.into_tensor(shape).ok()
}

/// A tensor's nested arrays as they are read.
struct Nested<'a> {
    spec: &'a TensorSpec,
    limits: &'a Limits,
    /// Each dimension's length, known once its first array closes.
    dims: Vec<Option<usize>>,
    elements: Elements<'a>,
}

impl Nested<'_> {
    /// One array at `depth`, checked as the serde decoder checks it: where that one would refuse it, `None`.
    fn level(&mut self, scan: &mut Scan<'_>, depth: usize) -> Option<()> {
        scan.eat(b"[")?;
        let fixed = usize::try_from(self.spec.shape[depth]).ok();
        let limit = fixed.or(self.dims[depth]);
        let innermost = depth + 1 == self.spec.shape.len();
        let mut n = 0usize;
        loop {
            if innermost {
                self.elements.number::<serde::de::value::Error>(scan.number()?).ok()?;
                if self.elements.count > self.limits.max_elements {
                    return None;
                }
            } else {
                self.level(scan, depth + 1)?;
            }
            n += 1;
            if limit.is_some_and(|l| n > l) || (depth == 0 && n > self.limits.max_rows) {
                return None;
            }
            scan.skip_space();
            match scan.body.get(scan.at)? {
                b',' => scan.at += 1,
                b']' => {
                    scan.at += 1;
                    break;
                }
                _ => return None,
            }
        }
        if limit.is_some_and(|l| l != n) {
            return None;
        }
        self.dims[depth] = Some(n);
        Some(())
    }
}

/// A place in the body.
struct Scan<'a> {
    body: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn skip_space(&mut self) {
        while matches!(self.body.get(self.at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }

    /// `text` after any white space.
    fn eat(&mut self, text: &[u8]) -> Option<()> {
        self.skip_space();
        self.body.get(self.at..)?.starts_with(text).then(|| self.at += text.len())
    }

    fn digit(&self) -> Option<u8> {
        self.body.get(self.at).filter(|b| b.is_ascii_digit()).map(|b| b - b'0')
    }

    /// The digits from here into `significand`, each a power of ten down in `exponent` when `fraction`; `None` where
    /// the significand would pass 64 bits (serde_json reads those another way).
    fn digits(&mut self, significand: &mut u64, exponent: &mut i32, fraction: bool) -> Option<()> {
        while let Some(d) = self.digit() {
            *significand = significand.checked_mul(10)?.checked_add(u64::from(d))?;
            *exponent -= i32::from(fraction);
            self.at += 1;
        }
        Some(())
    }

    /// A JSON number, as serde_json gives it to a visitor: an unsigned integer, a negative one, or a float.
    fn number(&mut self) -> Option<Number> {
        self.skip_space();
        let negative = self.body.get(self.at) == Some(&b'-');
        self.at += usize::from(negative);
        let mut significand = u64::from(self.digit()?);
        self.at += 1;
        let mut exponent = 0i32;
        if significand == 0 {
            // One leading zero at most.
            if self.digit().is_some() {
                return None;
            }
        } else {
            self.digits(&mut significand, &mut exponent, false)?;
        }
        let mut float = false;
        if self.body.get(self.at) == Some(&b'.') {
            self.at += 1;
            self.digit()?;
            self.digits(&mut significand, &mut exponent, true)?;
            float = true;
        }
        if matches!(self.body.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            let sign = self.body.get(self.at).copied();
            let positive = sign != Some(b'-');
            self.at += usize::from(matches!(sign, Some(b'+' | b'-')));
            let mut exp = i32::from(self.digit()?);
            self.at += 1;
            while let Some(d) = self.digit() {
                exp = exp.checked_mul(10)?.checked_add(i32::from(d))?;
                self.at += 1;
            }
            exponent = if positive { exponent.saturating_add(exp) } else { exponent.saturating_sub(exp) };
            float = true;
        }
        if !float {
            if !negative {
                return Some(Number::U(significand));
            }
            // As serde_json: a float on `-0` and below i64's range.
            let neg = (significand as i64).wrapping_neg();
            return Some(if neg >= 0 { Number::F(-(significand as f64)) } else { Number::I(neg) });
        }
        // serde_json's float from its parts (without its `float_roundtrip` feature): the significand times or over
        // one power of ten from its table.
        let pow = *pow10().get(exponent.unsigned_abs() as usize)?;
        let f = if exponent >= 0 { significand as f64 * pow } else { significand as f64 / pow };
        if f.is_infinite() {
            return None;
        }
        Some(Number::F(if negative { -f } else { f }))
    }
}

/// 1e0 to 1e308, each the nearest f64 (as the literals of serde_json's table are).
fn pow10() -> &'static [f64; 309] {
    static TABLE: OnceLock<[f64; 309]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|i| format!("1e{i}").parse().unwrap_or(f64::INFINITY)))
}

#[cfg(test)]
#[path = "plain_tests.rs"]
mod tests;
