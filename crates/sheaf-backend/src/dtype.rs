//! Tensor element types, named as the KServe v2 protocol and Triton name them.

use std::fmt;

/// The element type of a tensor. Every type here has a fixed size, so tensors are plain
/// little-endian byte buffers.
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
}

impl DataType {
    /// Every supported type, in a stable order.
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

    /// Size of one element in bytes (BOOL is one byte, as in the binary tensor extension).
    pub fn size(self) -> usize {
        match self {
            DataType::Bool | DataType::U8 | DataType::I8 => 1,
            DataType::U16 | DataType::I16 | DataType::F16 | DataType::BF16 => 2,
            DataType::U32 | DataType::I32 | DataType::F32 => 4,
            DataType::U64 | DataType::I64 | DataType::F64 => 8,
        }
    }

    /// Whether the type holds integers (BOOL counts: 0 or 1).
    pub fn is_integer(self) -> bool {
        !matches!(
            self,
            DataType::F16 | DataType::BF16 | DataType::F32 | DataType::F64
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
        }
    }

    /// Parses a protocol name; `None` for names sheaf does not support (such as `BYTES`).
    pub fn parse(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.as_str() == name)
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
}
