//! Tensor element types, named as the KServe v2 protocol and Triton name them.

use std::fmt;

/// The element type of a tensor. Every type but [`DataType::Bytes`] has a fixed size, and its
/// tensors are plain little-endian byte buffers; a BYTES tensor holds byte strings, each as its
/// length (4 bytes, little endian) and then its bytes, as the KServe protocols send them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
    /// Byte strings (text, encoded images), which only backends that take them see (Python).
    Bytes,
}

impl DataType {
    /// Every fixed-size type, in a stable order ([`DataType::Bytes`] is not among them).
    pub const ALL: [DataType; 13] = [
        DataType::Bool,
        DataType::U8,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::F16,
        DataType::BF16,
        DataType::F32,
        DataType::F64,
    ];

    /// Size of one element in bytes (BOOL is one byte, as in the binary tensor extension; a
    /// BYTES element takes at least its 4-byte length).
    pub fn size(self) -> usize {
        match self {
            DataType::Bool | DataType::U8 | DataType::I8 => 1,
            DataType::U16 | DataType::I16 | DataType::F16 | DataType::BF16 => 2,
            DataType::U32 | DataType::I32 | DataType::F32 => 4,
            DataType::U64 | DataType::I64 | DataType::F64 => 8,
            // The length of an element; an empty string is just that.
            DataType::Bytes => 4,
        }
    }

    /// Whether the type holds integers (BOOL counts: 0 or 1).
    pub fn is_integer(self) -> bool {
        !matches!(
            self,
            DataType::F16 | DataType::BF16 | DataType::F32 | DataType::F64 | DataType::Bytes
        )
    }

    /// The protocol name: `FP32`, `INT64`, `BOOL`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::U8 => "UINT8",
            DataType::U16 => "UINT16",
            DataType::U32 => "UINT32",
            DataType::U64 => "UINT64",
            DataType::I8 => "INT8",
            DataType::I16 => "INT16",
            DataType::I32 => "INT32",
            DataType::I64 => "INT64",
            DataType::F16 => "FP16",
            DataType::BF16 => "BF16",
            DataType::F32 => "FP32",
            DataType::F64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Parses the name of a fixed-size type; `None` for any other (`BYTES` included: the
    /// protocols carry byte strings apart, see [`DataType::parse_any`]).
    pub fn parse(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// Parses a protocol name, `BYTES` included.
    pub fn parse_any(name: &str) -> Option<DataType> {
        match name {
            "BYTES" => Some(DataType::Bytes),
            other => DataType::parse(other),
        }
    }

    /// The name Triton's model configuration gives the type: `TYPE_FP32`, `TYPE_INT64`, ...,
    /// and `TYPE_STRING` for byte strings (which the protocols call `BYTES`).
    pub fn config_name(self) -> &'static str {
        match self {
            DataType::Bool => "TYPE_BOOL",
            DataType::U8 => "TYPE_UINT8",
            DataType::U16 => "TYPE_UINT16",
            DataType::U32 => "TYPE_UINT32",
            DataType::U64 => "TYPE_UINT64",
            DataType::I8 => "TYPE_INT8",
            DataType::I16 => "TYPE_INT16",
            DataType::I32 => "TYPE_INT32",
            DataType::I64 => "TYPE_INT64",
            DataType::F16 => "TYPE_FP16",
            DataType::BF16 => "TYPE_BF16",
            DataType::F32 => "TYPE_FP32",
            DataType::F64 => "TYPE_FP64",
            DataType::Bytes => "TYPE_STRING",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::parse(d.as_str()), Some(d));
        }
        assert_eq!(DataType::parse("BYTES"), None);
        assert_eq!(DataType::parse("fp32"), None);
    }

    #[test]
    fn configuration_names_are_triton_s() {
        for d in DataType::ALL {
            assert_eq!(d.config_name(), format!("TYPE_{}", d.as_str()));
        }
        assert_eq!(DataType::Bytes.config_name(), "TYPE_STRING");
    }
}
