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

/// Parses a JSON number array (nested or flat) of `dtype` values into bytes. `expected`, the
/// element count the shape declares, sizes the buffer only as far as the text can hold values
/// (each takes at least one character and a separator), so a declared shape never sets aside
/// more memory than the body itself justifies; the caller checks the count.
pub fn parse(raw: &str, dtype: DataType, expected: usize) -> Result<Vec<u8>, String> {
    let most = raw.len().div_ceil(2);
    let mut out = Vec::with_capacity(expected.min(most).saturating_mul(dtype.size()));
    let mut de = serde_json::Deserializer::from_str(raw);
    Flatten {
        dtype,
        out: &mut out,
    }
    .deserialize(&mut de)
    .map_err(|e| strip_position(e.to_string()))?;
    Ok(out)
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
        while seq
            .next_element_seed(Flatten {
                dtype,
                out: &mut *self.out,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        if self.dtype != DataType::Bool {
            return Err(E::custom(format!("found a boolean in {} data", self.dtype)));
        }
        self.out.push(v as u8);
        Ok(())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        push_int(self.dtype, v as i128, self.out).map_err(E::custom)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        push_int(self.dtype, v as i128, self.out).map_err(E::custom)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        let out = self.out;
        match self.dtype {
            DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DataType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            DataType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DataType::Bool => return Err(E::custom(format!("found the number {v} in BOOL data"))),
            int if v.fract() == 0.0 && v.abs() < 1e19 => {
                return push_int(int, v as i128, out).map_err(E::custom)
            }
            int => {
                return Err(E::custom(format!(
                    "found the non-integer {v} in {int} data"
                )))
            }
        }
        Ok(())
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        Err(E::custom(format!(
            "found the string {v:?} in {} data",
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
        DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DataType::F64 => out.extend_from_slice(&(v as f64).to_le_bytes()),
        DataType::F16 => out.extend_from_slice(&f16::from_f64(v as f64).to_le_bytes()),
        DataType::BF16 => out.extend_from_slice(&bf16::from_f64(v as f64).to_le_bytes()),
        DataType::Bool => return Err(format!("found the number {v} in BOOL data")),
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
            }
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(dtype: DataType, json: &str) -> String {
        let bytes = parse(json, dtype, 0).unwrap();
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
        let bytes = parse("[56.921970534535916]", DataType::F64, 1).unwrap();
        assert_eq!(
            f64::from_le_bytes(bytes.try_into().unwrap()),
            56.921970534535916
        );
    }

    #[test]
    fn nested_arrays_flatten_in_row_major_order() {
        assert_eq!(round_trip(DataType::I32, "[[1, 2], [3, 4]]"), "[1,2,3,4]");
    }

    #[test]
    fn a_declared_size_beyond_the_text_sets_nothing_aside_for_it() {
        // 2^33 elements of FP32 would be 32 GiB; the text holds one value.
        let out = parse("[0]", DataType::F32, 1 << 33).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out.capacity() <= 8, "capacity {}", out.capacity());
        assert_eq!(parse("[[1,2],[3,4]]", DataType::I64, 4).unwrap().len(), 32);
    }

    #[test]
    fn wrong_values_are_named() {
        let e = parse("[256]", DataType::U8, 1).unwrap_err();
        assert!(e.contains("256 is out of range for UINT8"), "{e}");
        let e = parse("[1.5]", DataType::I32, 1).unwrap_err();
        assert!(e.contains("non-integer 1.5"), "{e}");
        let e = parse("[\"a\"]", DataType::F32, 1).unwrap_err();
        assert!(e.contains("string"), "{e}");
        let e = parse("[1]", DataType::Bool, 1).unwrap_err();
        assert!(e.contains("BOOL"), "{e}");
        assert!(parse("[1,", DataType::F32, 1).is_err());
    }
}
