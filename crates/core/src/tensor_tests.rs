//! Tensors: construction, the NaN scan, joining and splitting rows, and bytes shared with other owners.

use super::*;

#[test]
fn the_first_non_finite_element_is_found_in_every_float_type() {
    use half::{bf16, f16};
    let t = Tensor::from_slice(vec![2, 2], &[1.0f32, 2.0, f32::NAN, f32::INFINITY]).expect("valid");
    assert!(matches!(t.first_non_finite(), Some((2, v)) if v.is_nan()));
    let t = Tensor::from_slice(vec![3], &[0.0f64, f64::NEG_INFINITY, 1.0]).expect("valid");
    assert_eq!(t.first_non_finite(), Some((1, f64::NEG_INFINITY)));
    let t = Tensor::from_slice(vec![2], &[f16::from_f32(1.0), f16::INFINITY]).expect("valid");
    assert_eq!(t.first_non_finite(), Some((1, f64::INFINITY)));
    let t = Tensor::from_slice(vec![1], &[bf16::NAN]).expect("valid");
    assert!(matches!(t.first_non_finite(), Some((0, v)) if v.is_nan()));
    assert_eq!(Tensor::from_slice(vec![2], &[1.0f32, -3.5]).expect("valid").first_non_finite(), None);
    assert_eq!(Tensor::from_slice(vec![2], &[1i64, 2]).expect("valid").first_non_finite(), None);
    // Past the first blocks, at its exact index; the largest finite numbers, subnormals and -0 pass.
    let mut values = [f32::MAX, -f32::MAX, f32::MIN_POSITIVE / 2.0, -0.0].repeat(1000);
    assert_eq!(Tensor::from_slice(vec![4000], &values).expect("valid").first_non_finite(), None);
    values[2777] = f32::NEG_INFINITY;
    values[3001] = f32::NAN;
    assert_eq!(
        Tensor::from_slice(vec![4000], &values).expect("valid").first_non_finite(),
        Some((2777, f64::NEG_INFINITY))
    );
    let wide = vec![f64::MAX; 1500].into_iter().chain([f64::NAN]).collect::<Vec<_>>();
    assert!(
        matches!(Tensor::from_slice(vec![1501], &wide).expect("valid").first_non_finite(), Some((1500, v)) if v.is_nan())
    );
    // Bytes that cannot be seen as words in place are read element by element, to the same answer.
    let mut shifted = vec![0u8];
    shifted.extend_from_slice(crate::dtype::le_bytes(&values).as_ref());
    let bad = |w: u32| w & 0x7f80_0000 == 0x7f80_0000;
    assert!(u32::view(&shifted[1..]).is_none());
    assert_eq!(first_with(&shifted[1..], bad), Some(2777));
    assert_eq!(first_with(&shifted[1..2777 * 4 + 1], bad), None);
}

#[test]
fn elements_are_borrowed_in_place_only_as_their_own_type() {
    let t = Tensor::from_slice(vec![3], &[1.5f32, -2.0, 0.25]).expect("valid");
    assert_eq!(t.as_slice::<f32>(), Some(&[1.5f32, -2.0, 0.25][..]));
    assert_eq!(t.as_slice::<u32>(), None);
    let flags = Tensor::from_slice(vec![2], &[true, false]).expect("valid");
    assert_eq!(flags.raw_bytes(), Some(&[1u8, 0][..]));
    assert_eq!(flags.as_slice::<bool>(), None);
    assert_eq!(flags.to_vec::<bool>().expect("bool"), vec![true, false]);
}

fn iota(rows: usize, cols: usize, offset: f32) -> Tensor {
    let values: Vec<f32> = (0..rows * cols).map(|i| i as f32 + offset).collect();
    Tensor::from_slice(vec![rows, cols], &values).expect("valid tensor")
}

#[test]
fn new_checks_the_byte_length_against_the_shape() {
    assert!(Tensor::new(DataType::Fp32, vec![2, 3], vec![0; 24]).is_ok());
    let err = Tensor::new(DataType::Fp32, vec![2, 3], vec![0; 23]).expect_err("one byte short");
    assert!(err.to_string().contains("needs 24 bytes, got 23"), "{err}");
    let err = Tensor::new(DataType::Fp32, vec![usize::MAX, 2], vec![]).expect_err("overflows");
    assert!(err.to_string().contains("more elements"), "{err}");
}

#[test]
fn a_tensor_is_written_a_block_at_a_time_up_to_its_first_non_finite_element() {
    let copy = |t: &Tensor| {
        let mut out = Vec::new();
        let found = t.write_finite(|offset, block| {
            assert_eq!(offset, out.len(), "blocks in order, none left out");
            out.extend_from_slice(block);
            Ok::<(), ()>(())
        });
        (found.expect("no write fails"), out)
    };
    let mut values: Vec<f32> = (0..20_000).map(|i| i as f32).collect();
    let finite = Tensor::from_slice(vec![20_000], &values).expect("valid");
    assert_eq!(copy(&finite), (None, finite.raw_bytes().expect("fixed").to_vec()));
    // Found in the third block: the two before are written, none of it.
    values[17_000] = f32::NAN;
    values[19_000] = f32::INFINITY;
    let (found, written) = copy(&Tensor::from_slice(vec![20_000], &values).expect("valid"));
    assert!(matches!(found, Some((17_000, v)) if v.is_nan()));
    assert_eq!(written.len(), 2 * WRITE_BLOCK_ELEMENTS * 4);
    let halves = [half::f16::from_f32(1.0), half::f16::NEG_INFINITY];
    assert_eq!(copy(&Tensor::from_slice(vec![2], &halves).expect("valid")).0, Some((1, f64::NEG_INFINITY)));
    // Integers are never refused; a write's error ends it.
    assert_eq!(copy(&Tensor::from_slice(vec![3], &[1i32, 2, 3]).expect("valid")).0, None);
    assert_eq!(finite.write_finite(|_, _| Err("full")), Err("full"));
}

#[test]
fn concat_then_split_restores_the_parts() {
    let a = iota(1, 3, 0.0);
    let b = iota(2, 3, 100.0);
    let c = iota(3, 3, 200.0);
    let joined = Tensor::concat_rows(&[&a, &b, &c]).expect("same trailing dims");
    assert_eq!(joined.shape(), &[6, 3]);
    let values = joined.to_vec::<f32>().expect("fp32");
    assert_eq!(&values[..6], &[0.0, 1.0, 2.0, 100.0, 101.0, 102.0]);
    assert_eq!(values[17], 208.0);
    let parts = joined.split_rows(&[1, 2, 3]).expect("counts add up");
    // The pieces are the joined tensor's own bytes, row after row, not copies.
    let start = joined.raw_bytes().expect("fixed").as_ptr();
    let at: Vec<usize> =
        parts.iter().map(|p| p.raw_bytes().expect("fixed").as_ptr() as usize - start as usize).collect();
    assert_eq!(at, [0, 12, 36]);
    assert_eq!(parts, vec![a.clone(), b, c]);
    // A lone part is the batch as it is.
    let lone = Tensor::concat_rows(&[&a]).expect("one part");
    assert_eq!(lone.raw_bytes().map(<[u8]>::as_ptr), a.raw_bytes().map(<[u8]>::as_ptr));
    assert_eq!(lone, a);
}

#[test]
fn a_tensor_holds_bytes_that_another_owner_keeps() {
    struct Held(Vec<u8>);
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    let values = [1.5f32, -2.0, 3.25];
    let held = Held(crate::dtype::le_bytes(&values).into_owned());
    let at = held.0.as_ptr();
    let t = Tensor::new(DataType::Fp32, vec![3], Bytes::from_owner(held)).expect("12 bytes");
    assert_eq!(t.raw_bytes().map(<[u8]>::as_ptr), Some(at));
    assert_eq!(t.as_slice::<f32>(), Some(&values[..]));
    assert!(Tensor::new(DataType::Fp32, vec![4], Bytes::from_owner(Held(vec![0; 12]))).is_err());
}

#[test]
fn concat_refuses_mismatched_parts() {
    let a = iota(1, 3, 0.0);
    let b = iota(1, 4, 0.0);
    assert!(Tensor::concat_rows(&[&a, &b]).is_err());
    let c = Tensor::from_slice(vec![1, 3], &[1i32, 2, 3]).expect("valid");
    assert!(Tensor::concat_rows(&[&a, &c]).is_err());
    assert!(Tensor::concat_rows(&[]).is_err());
}

#[test]
fn split_refuses_counts_that_do_not_add_up() {
    let t = iota(3, 2, 0.0);
    assert!(t.split_rows(&[1, 1]).is_err());
    assert!(t.split_rows(&[2, 2]).is_err());
    assert_eq!(t.split_rows(&[0, 3]).expect("zero-row piece").first().map(Tensor::rows), Some(0));
}

#[test]
fn byte_string_tensors_concat_and_split_by_rows() {
    let a = Tensor::from_byte_strings(vec![1, 2], vec![b"a".to_vec(), b"bc".to_vec()]).expect("valid");
    let b = Tensor::from_byte_strings(vec![1, 2], vec![b"".to_vec(), b"def".to_vec()]).expect("valid");
    let joined = Tensor::concat_rows(&[&a, &b]).expect("same dims");
    assert_eq!(joined.shape(), &[2, 2]);
    assert_eq!(joined.byte_strings().map(<[Vec<u8>]>::len), Some(4));
    assert_eq!(joined.split_rows(&[1, 1]).expect("valid"), vec![a, b]);
}

#[test]
fn padded_concat_fills_the_shorter_sequences_with_zeros() {
    let a = Tensor::from_slice(vec![1, 3], &[1i64, 2, 3]).expect("valid");
    let b = Tensor::from_slice(vec![2, 1], &[4i64, 5]).expect("valid");
    let joined = Tensor::concat_rows_padded(&[&a, &b]).expect("same rank");
    assert_eq!(joined.shape(), &[3, 3]);
    assert_eq!(joined.to_vec::<i64>().expect("i64"), vec![1, 2, 3, 4, 0, 0, 5, 0, 0]);
    let c = Tensor::from_slice(vec![3], &[1i64, 2, 3]).expect("valid");
    assert!(Tensor::concat_rows_padded(&[&c]).is_err());
    let d = Tensor::from_slice(vec![1, 1], &[1i32]).expect("valid");
    assert!(Tensor::concat_rows_padded(&[&a, &d]).is_err());
}

#[test]
fn to_vec_checks_the_type() {
    let t = iota(1, 2, 0.0);
    assert!(t.to_vec::<i32>().is_err());
    assert_eq!(t.to_vec::<f32>().expect("fp32"), vec![0.0, 1.0]);
}
