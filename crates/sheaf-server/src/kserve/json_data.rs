//! Tensor `data` in JSON: flattening (possibly nested) arrays into typed little-endian bytes, and
//! writing bytes back as a flat JSON array.
//!
//! Parsing goes straight from the raw JSON text to bytes through a serde visitor, so a large
//! tensor never becomes a tree of `serde_json::Value`s.

use std::fmt;

use half::{bf16, f16};
use serde::de::{DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeSeq, Serializer};
use sheaf_backend::DataType;

/// Parses a JSON number array of `dtype` values into bytes. The array is flat, or nested
/// exactly as `shape` declares: ragged rows, or nesting of another shape, are refused. The
/// element count the shape declares sizes the buffer only as far as the text can hold values
/// (each takes at least one character and a separator), so a declared shape never sets aside
/// more memory than the body itself justifies; the caller checks the count. A value beyond
/// the range of `dtype` is refused rather than rounded to infinity.
pub fn parse(raw: &str, dtype: DataType, shape: &[usize]) -> Result<Vec<u8>, String> {
    let expected = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .unwrap_or(usize::MAX);
    let most = raw.len().div_ceil(2);
    let mut out = Vec::with_capacity(expected.min(most).saturating_mul(dtype.size()));
    let mut layout = Layout::default();
    let mut de = serde_json::Deserializer::from_str(raw);
    Flatten {
        dtype,
        out: &mut out,
        layout: &mut layout,
        depth: 0,
    }
    .deserialize(&mut de)
    .map_err(|e| strip_position(e.to_string()))?;
    layout.check(shape)?;
    Ok(out)
}

/// The nesting of a `data` array as parsed: the length of the arrays at each depth, and the
/// depth of the values.
#[derive(Debug, Default)]
struct Layout {
    lengths: Vec<Option<usize>>,
    leaf_depth: Option<usize>,
}

impl Layout {
    /// Records an array of `len` elements at `depth` (inner arrays end first, so depths come
    /// in any order); rows of another length make the data ragged.
    fn array(&mut self, depth: usize, len: usize) -> Result<(), String> {
        if self.lengths.len() <= depth {
            self.lengths.resize(depth + 1, None);
        }
        match self.lengths[depth] {
            None => {
                self.lengths[depth] = Some(len);
                Ok(())
            }
            Some(seen) if seen == len => Ok(()),
            Some(seen) => Err(format!(
                "ragged data: arrays at depth {depth} hold {seen} and {len} values"
            )),
        }
    }

    /// Records a value at `depth`; values at two depths make the data ragged.
    fn leaf(&mut self, depth: usize) -> Result<(), String> {
        match self.leaf_depth {
            None => {
                self.leaf_depth = Some(depth);
                Ok(())
            }
            Some(d) if d == depth => Ok(()),
            Some(d) => Err(format!(
                "ragged data: values are nested {d} and {depth} arrays deep"
            )),
        }
    }

    /// Flat data is taken for any shape (the caller checks the count); nested data must be
    /// nested as `shape` is.
    fn check(&self, shape: &[usize]) -> Result<(), String> {
        let Some(leaf_depth) = self.leaf_depth else {
            // No values at all: the caller's count check decides.
            return Ok(());
        };
        if leaf_depth <= 1 {
            return Ok(());
        }
        let lengths: Vec<usize> = self.lengths.iter().map(|l| l.unwrap_or(0)).collect();
        if lengths.len() != leaf_depth || lengths != shape {
            return Err(format!(
                "the nesting of 'data' is {lengths:?}, which is neither flat nor the shape {shape:?}"
            ));
        }
        Ok(())
    }
}

/// serde_json appends "at line 1 column N", which points into the `data` fragment, not the body.
fn strip_position(msg: String) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    }
}

struct Flatten<'a> {
    dtype: DataType,
    out: &'a mut Vec<u8>,
    layout: &'a mut Layout,
    /// How many arrays enclose the value being parsed.
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flatten<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an array of {} values", self.dtype)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let dtype = self.dtype;
        let mut len = 0;
        while seq
            .next_element_seed(Flatten {
                dtype,
                out: &mut *self.out,
                layout: &mut *self.layout,
                depth: self.depth + 1,
            })?
            .is_some()
        {
            len += 1;
        }
        self.layout
            .array(self.depth, len)
            .map_err(serde::de::Error::custom)
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.layout.leaf(self.depth).map_err(E::custom)?;
        if self.dtype != DataType::Bool {
            return Err(E::custom(format!("found a boolean in {} data", self.dtype)));
        }
        self.out.push(v as u8);
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.layout.leaf(self.depth).map_err(E::custom)?;
        push_int(self.dtype, v as i128, self.out).map_err(E::custom)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.layout.leaf(self.depth).map_err(E::custom)?;
        push_int(self.dtype, v as i128, self.out).map_err(E::custom)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        self.layout.leaf(self.depth).map_err(E::custom)?;
        let out = self.out;
        match self.dtype {
            DataType::F32 | DataType::F16 | DataType::BF16 | DataType::F64 => {
                push_float(self.dtype, v, out).map_err(E::custom)
            }
            DataType::Bool => Err(E::custom(format!("found the number {v} in BOOL data"))),
            int if v.fract() == 0.0 && v.abs() < 1e19 => {
                push_int(int, v as i128, out).map_err(E::custom)
            }
            int => Err(E::custom(format!(
                "found the non-integer {v} in {int} data"
            ))),
        }
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        Err(E::custom(format!(
            "found the string \"{}\" in {} data",
            sheaf_core::clip(v),
            self.dtype
        )))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Err(E::custom(format!("found null in {} data", self.dtype)))
    }
}

fn push_int(dtype: DataType, v: i128, out: &mut Vec<u8>) -> Result<(), String> {
    let range = || format!("value {v} is out of range for {dtype}");
    match dtype {
        DataType::U8 => out.push(u8::try_from(v).map_err(|_| range())?),
        DataType::I8 => out.extend_from_slice(&i8::try_from(v).map_err(|_| range())?.to_le_bytes()),
        DataType::U16 => {
            out.extend_from_slice(&u16::try_from(v).map_err(|_| range())?.to_le_bytes())
        }
        DataType::I16 => {
            out.extend_from_slice(&i16::try_from(v).map_err(|_| range())?.to_le_bytes())
        }
        DataType::U32 => {
            out.extend_from_slice(&u32::try_from(v).map_err(|_| range())?.to_le_bytes())
        }
        DataType::I32 => {
            out.extend_from_slice(&i32::try_from(v).map_err(|_| range())?.to_le_bytes())
        }
        DataType::U64 => {
            out.extend_from_slice(&u64::try_from(v).map_err(|_| range())?.to_le_bytes())
        }
        DataType::I64 => {
            out.extend_from_slice(&i64::try_from(v).map_err(|_| range())?.to_le_bytes())
        }
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16 => {
            return push_float(dtype, v as f64, out)
        }
        DataType::Bool => return Err(format!("found the number {v} in BOOL data")),
        DataType::Bytes => return Err(format!("found the number {v} in BYTES data")),
    }
    Ok(())
}

/// Appends `v` as the float type `dtype`. A finite value too large for it (1e39 in FP32) is
/// refused: it would become infinity, and then `null` in a JSON answer.
fn push_float(dtype: DataType, v: f64, out: &mut Vec<u8>) -> Result<(), String> {
    let overflow = |finite: bool| {
        if finite {
            Ok(())
        } else {
            Err(format!("value {v:e} is out of range for {dtype}"))
        }
    };
    match dtype {
        DataType::F32 => {
            let x = v as f32;
            overflow(x.is_finite())?;
            out.extend_from_slice(&x.to_le_bytes())
        }
        DataType::F16 => {
            let x = f16::from_f64(v);
            overflow(x.is_finite())?;
            out.extend_from_slice(&x.to_le_bytes())
        }
        DataType::BF16 => {
            let x = bf16::from_f64(v);
            overflow(x.is_finite())?;
            out.extend_from_slice(&x.to_le_bytes())
        }
        _ => out.extend_from_slice(&v.to_le_bytes()),
    }
    Ok(())
}

/// Serializes tensor bytes as a flat JSON array of `dtype` values.
#[derive(Debug, Clone, Copy)]
pub struct DataView<'a> {
    pub dtype: DataType,
    pub bytes: &'a [u8],
}

impl Serialize for DataView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let size = self.dtype.size();
        let mut seq = serializer.serialize_seq(Some(self.bytes.len() / size))?;
        for chunk in self.bytes.chunks_exact(size) {
            macro_rules! le {
                ($t:ty) => {
                    <$t>::from_le_bytes(chunk.try_into().map_err(|_| {
                        <S::Error as serde::ser::Error>::custom("truncated tensor data")
                    })?)
                };
            }
            match self.dtype {
                DataType::Bool => seq.serialize_element(&(chunk[0] != 0))?,
                DataType::U8 => seq.serialize_element(&chunk[0])?,
                DataType::I8 => seq.serialize_element(&le!(i8))?,
                DataType::U16 => seq.serialize_element(&le!(u16))?,
                DataType::I16 => seq.serialize_element(&le!(i16))?,
                DataType::U32 => seq.serialize_element(&le!(u32))?,
                DataType::I32 => seq.serialize_element(&le!(i32))?,
                DataType::U64 => seq.serialize_element(&le!(u64))?,
                DataType::I64 => seq.serialize_element(&le!(i64))?,
                DataType::F16 => seq.serialize_element(&f16::from_bits(le!(u16)).to_f32())?,
                DataType::BF16 => seq.serialize_element(&bf16::from_bits(le!(u16)).to_f32())?,
                DataType::F32 => seq.serialize_element(&le!(f32))?,
                DataType::F64 => seq.serialize_element(&le!(f64))?,
                // BYTES answers are rendered apart, as strings.
                DataType::Bytes => {
                    return Err(<S::Error as serde::ser::Error>::custom(
                        "BYTES data is not a numeric array",
                    ))
                }
            }
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(dtype: DataType, json: &str) -> String {
        let bytes = parse(json, dtype, &[]).unwrap();
        serde_json::to_string(&DataView {
            dtype,
            bytes: &bytes,
        })
        .unwrap()
    }

    #[test]
    fn every_dtype_round_trips() {
        assert_eq!(
            round_trip(DataType::F32, "[1.5, -2, 3e-3]"),
            "[1.5,-2.0,0.003]"
        );
        assert_eq!(round_trip(DataType::F64, "[0.1]"), "[0.1]");
        assert_eq!(round_trip(DataType::F16, "[0.5, 2]"), "[0.5,2.0]");
        assert_eq!(round_trip(DataType::BF16, "[1.0]"), "[1.0]");
        assert_eq!(round_trip(DataType::I8, "[-128, 127]"), "[-128,127]");
        assert_eq!(round_trip(DataType::U8, "[0, 255]"), "[0,255]");
        assert_eq!(round_trip(DataType::I16, "[-300]"), "[-300]");
        assert_eq!(round_trip(DataType::U16, "[65535]"), "[65535]");
        assert_eq!(round_trip(DataType::I32, "[-7]"), "[-7]");
        assert_eq!(round_trip(DataType::U32, "[4000000000]"), "[4000000000]");
        assert_eq!(round_trip(DataType::I64, "[-9000000000]"), "[-9000000000]");
        assert_eq!(
            round_trip(DataType::U64, "[18446744073709551615]"),
            "[18446744073709551615]"
        );
        assert_eq!(round_trip(DataType::Bool, "[true, false]"), "[true,false]");
    }

    #[test]
    fn fp64_values_parse_exactly() {
        // One ULP away from what a fast, inexact parser produces.
        let bytes = parse("[56.921970534535916]", DataType::F64, &[1]).unwrap();
        assert_eq!(
            f64::from_le_bytes(bytes.try_into().unwrap()),
            56.921970534535916
        );
    }

    #[test]
    fn nested_arrays_flatten_in_row_major_order() {
        let bytes = parse("[[1, 2], [3, 4]]", DataType::I32, &[2, 2]).unwrap();
        let view = DataView {
            dtype: DataType::I32,
            bytes: &bytes,
        };
        assert_eq!(serde_json::to_string(&view).unwrap(), "[1,2,3,4]");
        assert!(parse("[1, 2, 3, 4]", DataType::I32, &[2, 2]).is_ok());
        assert!(parse("[[[1], [2]], [[3], [4]]]", DataType::I32, &[2, 2, 1]).is_ok());
    }

    #[test]
    fn ragged_or_misshapen_nesting_is_refused() {
        let e = parse("[[1, 2, 3], [4]]", DataType::I32, &[2, 2]).unwrap_err();
        assert!(e.contains("ragged"), "{e}");
        let e = parse("[[1, 2], 3, 4]", DataType::I32, &[2, 2]).unwrap_err();
        assert!(e.contains("ragged"), "{e}");
        let e = parse("[1, [2, 3], 4]", DataType::I32, &[2, 2]).unwrap_err();
        assert!(e.contains("ragged"), "{e}");
        let e = parse("[[1, 2, 3, 4]]", DataType::I32, &[2, 2]).unwrap_err();
        assert!(e.contains("neither flat nor the shape"), "{e}");
        // The example of a real report: rows of 256 and 768 values for shape [2, 512].
        let rows = format!(
            "[[{}], [{}]]",
            vec!["0"; 256].join(","),
            vec!["0"; 768].join(",")
        );
        let e = parse(&rows, DataType::F32, &[2, 512]).unwrap_err();
        assert!(e.contains("256 and 768"), "{e}");
    }

    #[test]
    fn floats_beyond_the_type_are_refused() {
        let e = parse("[1e39]", DataType::F32, &[1]).unwrap_err();
        assert!(e.contains("out of range for FP32"), "{e}");
        let e = parse("[-1e39]", DataType::F32, &[1]).unwrap_err();
        assert!(e.contains("out of range for FP32"), "{e}");
        let e = parse("[70000]", DataType::F16, &[1]).unwrap_err();
        assert!(e.contains("out of range for FP16"), "{e}");
        assert!(parse("[3.4e38, 1e-50]", DataType::F32, &[2]).is_ok());
        assert!(parse("[1e300]", DataType::F64, &[1]).is_ok());
    }

    #[test]
    fn a_declared_size_beyond_the_text_sets_nothing_aside_for_it() {
        // 2^33 elements of FP32 would be 32 GiB; the text holds one value.
        let out = parse("[0]", DataType::F32, &[1 << 33]).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out.capacity() <= 8, "capacity {}", out.capacity());
        assert_eq!(
            parse("[[1,2],[3,4]]", DataType::I64, &[2, 2])
                .unwrap()
                .len(),
            32
        );
    }

    #[test]
    fn wrong_values_are_named() {
        let e = parse("[256]", DataType::U8, &[1]).unwrap_err();
        assert!(e.contains("256 is out of range for UINT8"), "{e}");
        let e = parse("[1.5]", DataType::I32, &[1]).unwrap_err();
        assert!(e.contains("non-integer 1.5"), "{e}");
        let e = parse("[\"a\"]", DataType::F32, &[1]).unwrap_err();
        assert!(e.contains("string"), "{e}");
        let e = parse("[1]", DataType::Bool, &[1]).unwrap_err();
        assert!(e.contains("BOOL"), "{e}");
        assert!(parse("[1,", DataType::F32, &[1]).is_err());
    }
}
