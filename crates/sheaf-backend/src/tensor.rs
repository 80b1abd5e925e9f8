//! A dense tensor: element type, shape, and shared little-endian bytes.
//!
//! The bytes are a [`bytes::Bytes`], so slicing a batch output back into per-request pieces and
//! passing request bodies through to a backend copy nothing.

use bytes::{Bytes, BytesMut};

use crate::{BackendError, DataType};

/// A dense, row-major tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    dtype: DataType,
    shape: Vec<usize>,
    data: Bytes,
}

impl Tensor {
    /// Builds a tensor, checking that `data` holds exactly `shape`'s elements of `dtype`.
    pub fn new(dtype: DataType, shape: Vec<usize>, data: Bytes) -> Result<Tensor, BackendError> {
        let expected = byte_len(dtype, &shape)
            .ok_or_else(|| BackendError::InvalidInput(format!("shape {shape:?} is too large")))?;
        if data.len() != expected {
            return Err(BackendError::InvalidInput(format!(
                "{dtype} tensor of shape {shape:?} needs {expected} bytes, got {}",
                data.len()
            )));
        }
        Ok(Tensor { dtype, shape, data })
    }

    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size of dimension 0, the batch dimension for batched models (1 for a scalar).
    pub fn items(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Bytes of one item: one index along dimension 0.
    pub fn item_bytes(&self) -> usize {
        self.shape.iter().skip(1).product::<usize>() * self.dtype.size()
    }

    /// Items `start..start + len` along dimension 0, sharing this tensor's bytes.
    ///
    /// Panics if the range is out of bounds; callers slice ranges they formed themselves.
    pub fn slice_items(&self, start: usize, len: usize) -> Tensor {
        assert!(start + len <= self.items(), "item range out of bounds");
        let row = self.item_bytes();
        let mut shape = self.shape.clone();
        shape[0] = len;
        Tensor {
            dtype: self.dtype,
            shape,
            data: self.data.slice(start * row..(start + len) * row),
        }
    }

    /// Joins tensors along dimension 0. All parts must have the same dtype and item shape.
    pub fn concat(parts: &[Tensor]) -> Result<Tensor, BackendError> {
        let first = parts
            .first()
            .ok_or_else(|| BackendError::InvalidInput("nothing to concatenate".into()))?;
        if parts.len() == 1 {
            return Ok(first.clone());
        }
        let mut items = 0;
        for p in parts {
            if p.dtype != first.dtype || p.shape.get(1..) != first.shape.get(1..) {
                return Err(BackendError::InvalidInput(format!(
                    "cannot batch {} {:?} with {} {:?}",
                    p.dtype, p.shape, first.dtype, first.shape
                )));
            }
            items += p.items();
        }
        let mut data = BytesMut::with_capacity(items * first.item_bytes());
        for p in parts {
            data.extend_from_slice(&p.data);
        }
        let mut shape = first.shape.clone();
        shape[0] = items;
        Ok(Tensor {
            dtype: first.dtype,
            shape,
            data: data.freeze(),
        })
    }
}

impl Tensor {
    /// This tensor with zero rows appended along dimension 0 up to `items` (a copy); unchanged
    /// when it already has that many.
    pub fn pad_items(self, items: usize) -> Result<Tensor, BackendError> {
        if items <= self.items() {
            return Ok(self);
        }
        let mut data = BytesMut::with_capacity(items * self.item_bytes());
        data.extend_from_slice(&self.data);
        data.resize(items * self.item_bytes(), 0);
        let mut shape = self.shape.clone();
        shape[0] = items;
        Tensor::new(self.dtype, shape, data.freeze())
    }
}

/// Bytes needed for `shape` elements of `dtype`, or `None` on overflow.
pub fn byte_len(dtype: DataType, shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(items: usize, fill: u8) -> Tensor {
        Tensor::new(
            DataType::U8,
            vec![items, 2],
            Bytes::from(vec![fill; items * 2]),
        )
        .unwrap()
    }

    #[test]
    fn new_checks_byte_length() {
        let err = Tensor::new(DataType::F32, vec![2, 3], Bytes::from(vec![0u8; 20])).unwrap_err();
        assert!(err.to_string().contains("needs 24 bytes, got 20"), "{err}");
    }

    #[test]
    fn concat_then_slice_gives_back_the_parts() {
        let joined = Tensor::concat(&[t(1, 1), t(3, 2), t(2, 3)]).unwrap();
        assert_eq!(joined.shape(), &[6, 2]);
        assert_eq!(joined.slice_items(1, 3), t(3, 2));
        assert_eq!(joined.slice_items(4, 2), t(2, 3));
    }

    #[test]
    fn pad_items_appends_zero_rows() {
        let padded = t(2, 7).pad_items(4).unwrap();
        assert_eq!(padded.shape(), &[4, 2]);
        assert_eq!(padded.data().as_ref(), &[7, 7, 7, 7, 0, 0, 0, 0]);
        assert_eq!(t(3, 1).pad_items(2).unwrap(), t(3, 1));
    }

    #[test]
    fn concat_rejects_mismatched_item_shapes() {
        let other = Tensor::new(DataType::U8, vec![1, 3], Bytes::from(vec![0u8; 3])).unwrap();
        assert!(Tensor::concat(&[t(1, 0), other]).is_err());
    }
}
