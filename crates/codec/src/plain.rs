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
        // Counted in byte-wide lanes, 255 bytes at a time: a word-wide count cost 3.6 instructions a byte.
        let commas: usize =
            body.chunks(255).map(|c| usize::from(c.iter().fold(0u8, |n, &b| n + u8::from(b == b',')))).sum();
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
        // The most items the array may hold: its length where known, and the row limit for the outermost.
        let most = limit.unwrap_or(usize::MAX).min(if depth == 0 { self.limits.max_rows } else { usize::MAX });
        let n = if depth + 1 == self.spec.shape.len() {
            let count = self.elements.count;
            if let Some(out) = self.elements.fp32_bytes() {
                // Room for this many more: the row's length or the element limit, whichever is met first.
                let room = most.min(self.limits.max_elements.saturating_sub(count));
                let n = fp32_numbers(scan, room, out)?;
                self.elements.count += n;
                n
            } else {
                let (elements, max_elements) = (&mut self.elements, self.limits.max_elements);
                numbers(scan, most, |n| {
                    elements.number::<serde::de::value::Error>(n).ok()?;
                    (elements.count <= max_elements).then_some(())
                })?
            }
        } else {
            let mut n = 0usize;
            loop {
                self.level(scan, depth + 1)?;
                n += 1;
                if n > most {
                    return None;
                }
                if scan.separator()? {
                    break n;
                }
            }
        };
        if limit.is_some_and(|l| l != n) {
            return None;
        }
        self.dims[depth] = Some(n);
        Some(())
    }
}

/// The numbers of an innermost array, its `[` read, each given to `push` as serde_json would give it to a visitor:
/// how many there were, its `]` read. `None` past `most` numbers, where `push` refuses one, or where the serde
/// decoder would read the array another way. The loop every element of a body runs: the place in the body is kept
/// in a local, and the powers of ten are looked up once.
fn numbers(scan: &mut Scan<'_>, most: usize, mut push: impl FnMut(Number) -> Option<()>) -> Option<usize> {
    let (body, pow10) = (scan.body, pow10());
    let mut at = scan.at;
    let mut n = 0usize;
    loop {
        at = after_space(body, at);
        push(number(body, &mut at, pow10)?)?;
        n += 1;
        if n > most {
            return None;
        }
        let end;
        (end, at) = separator(body, at)?;
        if end {
            scan.at = at;
            return Some(n);
        }
    }
}

/// The numbers of an innermost array of an FP32 tensor, its `[` read, each appended to `out` as the FP32 value
/// serde's path stores for it: how many there were, its `]` read. `None` past `room` numbers, for one out of FP32's
/// range, or where the serde decoder would read the array another way. [`numbers`] with the value's type known:
/// no [`Number`] between the digits and the bytes, and one count for both limits.
fn fp32_numbers(scan: &mut Scan<'_>, room: usize, out: &mut Vec<u8>) -> Option<usize> {
    let (body, pow10) = (scan.body, pow10());
    let mut at = scan.at;
    let mut n = 0usize;
    loop {
        at = after_space(body, at);
        let value = parts(body, &mut at)?.value(pow10)? as f32;
        if !value.is_finite() || n == room {
            return None;
        }
        n += 1;
        out.extend_from_slice(&value.to_le_bytes());
        let end;
        (end, at) = separator(body, at)?;
        if end {
            scan.at = at;
            return Some(n);
        }
    }
}

/// After an array's item, from `at`: whether it was the last (past the closing bracket) or another follows (past a
/// comma), and where the next byte is.
#[inline(always)]
fn separator(body: &[u8], at: usize) -> Option<(bool, usize)> {
    let at = after_space(body, at);
    let end = match body.get(at)? {
        b',' => false,
        b']' => true,
        _ => return None,
    };
    Some((end, at + 1))
}

/// The first byte at or after `at` that is not JSON's white space.
#[inline(always)]
fn after_space(body: &[u8], mut at: usize) -> usize {
    while matches!(body.get(at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        at += 1;
    }
    at
}

/// The digit at `at`, if there is one.
#[inline(always)]
fn digit(body: &[u8], at: usize) -> Option<u64> {
    let d = body.get(at)?.wrapping_sub(b'0');
    (d < 10).then_some(u64::from(d))
}

/// The most digits a significand takes without passing 64 bits, whatever they are.
const SAFE_DIGITS: usize = 19;

/// A JSON number's parts as serde_json reads them: its significand (up to 64 bits), its power of ten, its sign,
/// and whether it was written as a float (with a fraction or an exponent).
#[derive(Clone, Copy)]
struct Parts {
    significand: u64,
    exponent: i32,
    negative: bool,
    float: bool,
}

impl Parts {
    /// The number as serde_json gives it to a visitor: an unsigned integer, a negative one, or a float. `None` where
    /// serde_json would refuse it (a float out of f64's range).
    #[inline(always)]
    fn number(self, pow10: &[f64; 309]) -> Option<Number> {
        let Parts { significand, negative, float, .. } = self;
        if !float {
            if !negative {
                return Some(Number::U(significand));
            }
            // As serde_json: a float on `-0` and below i64's range.
            let neg = (significand as i64).wrapping_neg();
            return Some(if neg >= 0 { Number::F(-(significand as f64)) } else { Number::I(neg) });
        }
        self.float(pow10).map(Number::F)
    }

    /// The number's value as f64, as [`Parts::number`]'s would be: a negative integer converts to the f64 its
    /// magnitude does, negated (rounding to nearest is symmetric), so one formula serves all three kinds.
    #[inline(always)]
    fn value(self, pow10: &[f64; 309]) -> Option<f64> {
        if !self.float {
            let v = self.significand as f64;
            return Some(if self.negative { -v } else { v });
        }
        self.float(pow10)
    }

    /// serde_json's float from its parts (without its `float_roundtrip` feature): the significand times or over one
    /// power of ten from its table.
    #[inline(always)]
    fn float(self, pow10: &[f64; 309]) -> Option<f64> {
        let pow = *pow10.get(self.exponent.unsigned_abs() as usize)?;
        let s = self.significand as f64;
        let f = if self.exponent >= 0 { s * pow } else { s / pow };
        if f.is_infinite() {
            return None;
        }
        Some(if self.negative { -f } else { f })
    }
}

/// A JSON number at `at`, as serde_json gives it to a visitor: an unsigned integer, a negative one, or a float.
/// `None` where serde_json would read it another way: a significand past 64 bits among them.
#[inline(always)]
fn number(body: &[u8], at: &mut usize, pow10: &[f64; 309]) -> Option<Number> {
    parts(body, at)?.number(pow10)
}

/// The parts of the JSON number at `at`, `at` moved past it. `None` where it is not one, or where serde_json would
/// read it another way: a significand past 64 bits among them. Each byte is read once, into `b`; a number is never
/// the body's last byte in the plain form (its `]` and `}` follow), so one that is gives `None`.
#[inline(always)]
fn parts(body: &[u8], at: &mut usize) -> Option<Parts> {
    let mut i = *at;
    let mut b = *body.get(i)?;
    let negative = b == b'-';
    if negative {
        i += 1;
        b = *body.get(i)?;
    }
    let first = i;
    // Digits are summed without overflow checks, which up to SAFE_DIGITS of them cannot need.
    let mut significand = u64::from(b.wrapping_sub(b'0'));
    if significand >= 10 {
        return None;
    }
    i += 1;
    b = *body.get(i)?;
    if significand == 0 {
        // One leading zero at most.
        if b.is_ascii_digit() {
            return None;
        }
    } else {
        while let d @ 0..=9 = b.wrapping_sub(b'0') {
            significand = significand.wrapping_mul(10).wrapping_add(u64::from(d));
            i += 1;
            b = *body.get(i)?;
        }
    }
    let mut digits = i - first;
    let mut exponent = 0i32;
    let mut float = false;
    if b == b'.' {
        i += 1;
        b = *body.get(i)?;
        let start = i;
        while let d @ 0..=9 = b.wrapping_sub(b'0') {
            significand = significand.wrapping_mul(10).wrapping_add(u64::from(d));
            i += 1;
            b = *body.get(i)?;
        }
        let fraction = i - start;
        if fraction == 0 {
            return None;
        }
        digits += fraction;
        exponent = i32::try_from(fraction).ok()?.checked_neg()?;
        float = true;
    }
    if digits > SAFE_DIGITS {
        significand = checked_significand(&body[first..i])?;
    }
    if b | 0x20 == b'e' {
        i += 1;
        let sign = body.get(i).copied();
        let positive = sign != Some(b'-');
        i += usize::from(matches!(sign, Some(b'+' | b'-')));
        let mut exp = i32::try_from(digit(body, i)?).ok()?;
        i += 1;
        while let Some(d) = digit(body, i) {
            exp = exp.checked_mul(10)?.checked_add(i32::try_from(d).ok()?)?;
            i += 1;
        }
        exponent = if positive { exponent.saturating_add(exp) } else { exponent.saturating_sub(exp) };
        float = true;
    }
    *at = i;
    Some(Parts { significand, exponent, negative, float })
}

/// The significand of a number's digits (`.` skipped), or `None` where it passes 64 bits, as serde_json reads it.
#[cold]
fn checked_significand(digits: &[u8]) -> Option<u64> {
    digits.iter().filter(|&&b| b != b'.').try_fold(0u64, |s, &b| s.checked_mul(10)?.checked_add(u64::from(b - b'0')))
}

/// A place in the body.
struct Scan<'a> {
    body: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn skip_space(&mut self) {
        self.at = after_space(self.body, self.at);
    }

    /// `text` after any white space.
    fn eat(&mut self, text: &[u8]) -> Option<()> {
        self.skip_space();
        self.body.get(self.at..)?.starts_with(text).then(|| self.at += text.len())
    }

    /// After an item of an array: `false` past a comma (another item follows), `true` past the closing bracket.
    fn separator(&mut self) -> Option<bool> {
        let end;
        (end, self.at) = separator(self.body, self.at)?;
        Some(end)
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
