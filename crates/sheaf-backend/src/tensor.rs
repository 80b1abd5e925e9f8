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
    /// `items` rows of nothing (shape `[items, 0]`): what stands for a batch's output in the
    /// answer of a request that does not read it.
    pub fn empty_rows(dtype: DataType, items: usize) -> Tensor {
        Tensor {
            dtype,
            shape: vec![items, 0],
            data: Bytes::new(),
        }
    }

    /// Builds a tensor, checking that `data` holds exactly `shape`'s elements of `dtype`.
    pub fn new(dtype: DataType, shape: Vec<usize>, data: Bytes) -> Result<Tensor, BackendError> {
        if dtype == DataType::Bytes {
            let count = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
            let found = count.and_then(|n| element_ends(&data, n).map(|ends| (n, ends)));
            return match found {
                Some((n, ends))
                    if ends.last().copied().unwrap_or(0) == data.len()
                        || n == 0 && data.is_empty() =>
                {
                    Ok(Tensor { dtype, shape, data })
                }
                _ => Err(BackendError::InvalidInput(format!(
                    "BYTES tensor of shape {shape:?}: its {} bytes do not hold exactly that many \
                     length-prefixed elements",
                    data.len()
                ))),
            };
        }
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
        let mut shape = self.shape.clone();
        shape[0] = len;
        let range = if self.dtype == DataType::Bytes {
            // Elements vary in length: find where the items start and end.
            let per_item: usize = self.shape.iter().skip(1).product();
            let ends = element_ends(&self.data, self.len()).unwrap_or_default();
            let at = |item: usize| match item * per_item {
                0 => 0,
                k => ends.get(k - 1).copied().unwrap_or(self.data.len()),
            };
            at(start)..at(start + len)
        } else {
            let row = self.item_bytes();
            start * row..(start + len) * row
        };
        Tensor {
            dtype: self.dtype,
            shape,
            data: self.data.slice(range),
        }
    }

    /// The tensor's bytes, giving up the tensor.
    pub fn into_data(self) -> Bytes {
        self.data
    }

    /// Joins tensors along dimension 0. All parts must have the same dtype and item shape.
    pub fn concat(parts: &[Tensor]) -> Result<Tensor, BackendError> {
        Tensor::concat_into(parts, BytesMut::new())
    }

    /// As [`Tensor::concat`], writing into `buffer` (cleared first) so that a caller can reuse
    /// buffers across batches. A single part is returned as it is, sharing its bytes.
    pub fn concat_into(parts: &[Tensor], mut buffer: BytesMut) -> Result<Tensor, BackendError> {
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
        buffer.clear();
        buffer.reserve(items * first.item_bytes());
        for p in parts {
            buffer.extend_from_slice(&p.data);
        }
        let mut shape = first.shape.clone();
        shape[0] = items;
        Ok(Tensor {
            dtype: first.dtype,
            shape,
            data: buffer.freeze(),
        })
    }
}

impl Tensor {
    /// A tensor of `shape` whose every element is `value` in `dtype` (for BYTES, the empty
    /// string).
    pub fn filled(dtype: DataType, shape: Vec<usize>, value: f64) -> Result<Tensor, BackendError> {
        let fill = encode(dtype, value);
        let total = shape.iter().product::<usize>();
        let data: Vec<u8> = fill
            .iter()
            .copied()
            .cycle()
            .take(total * fill.len())
            .collect();
        Tensor::new(dtype, shape, Bytes::from(data))
    }

    /// This tensor with zero rows appended along dimension 0 up to `items` (a copy); unchanged
    /// when it already has that many.
    pub fn pad_items(self, items: usize) -> Result<Tensor, BackendError> {
        if items <= self.items() {
            return Ok(self);
        }
        // Zero bytes are zero elements, and for BYTES empty strings (a length of 0).
        let grown = self.data.len() + (items - self.items()) * self.item_bytes();
        let mut data = BytesMut::with_capacity(grown);
        data.extend_from_slice(&self.data);
        data.resize(grown, 0);
        let mut shape = self.shape.clone();
        shape[0] = items;
        Tensor::new(self.dtype, shape, data.freeze())
    }
}

impl Tensor {
    /// This tensor grown to `target` (same rank, no dimension smaller), new elements set to
    /// `value` in this tensor's type. Every dimension may grow, the batch one included.
    pub fn pad_to(&self, target: &[usize], value: f64) -> Result<Tensor, BackendError> {
        if target == self.shape.as_slice() {
            return Ok(self.clone());
        }
        if self.dtype == DataType::Bytes {
            return Err(BackendError::InvalidInput(
                "BYTES tensors are not padded past the batch dimension".into(),
            ));
        }
        if target.len() != self.shape.len() || target.iter().zip(&self.shape).any(|(t, s)| t < s) {
            return Err(BackendError::InvalidInput(format!(
                "cannot pad shape {:?} to {target:?}",
                self.shape
            )));
        }
        let fill = encode(self.dtype, value);
        let total = target.iter().product::<usize>();
        let mut out: Vec<u8> = fill
            .iter()
            .copied()
            .cycle()
            .take(total * fill.len())
            .collect();
        copy_region(
            &self.data,
            &self.shape,
            &mut out,
            target,
            self.dtype.size(),
            Direction::Into,
        );
        Tensor::new(self.dtype, target.to_vec(), Bytes::from(out))
    }

    /// The leading `dims` of this tensor along every dimension: a slice of its bytes where
    /// they lie in one run (the dimensions before the first one cut hold one element each, and
    /// those after it are whole: one item's leading tokens), else a copy.
    pub fn crop(&self, dims: &[usize]) -> Result<Tensor, BackendError> {
        if dims == self.shape.as_slice() {
            return Ok(self.clone());
        }
        if self.dtype == DataType::Bytes {
            return Err(BackendError::InvalidInput(
                "BYTES tensors are not cropped".into(),
            ));
        }
        if dims.len() != self.shape.len() || dims.iter().zip(&self.shape).any(|(d, s)| d > s) {
            return Err(BackendError::InvalidInput(format!(
                "cannot crop shape {:?} to {dims:?}",
                self.shape
            )));
        }
        let total = dims.iter().product::<usize>() * self.dtype.size();
        if let Some(cut) = dims.iter().zip(&self.shape).position(|(d, s)| d != s) {
            let outer: usize = self.shape[..cut].iter().product();
            if outer == 1 && dims[cut + 1..] == self.shape[cut + 1..] {
                return Tensor::new(self.dtype, dims.to_vec(), self.data.slice(..total));
            }
        }
        let mut out = vec![0u8; total];
        copy_region(
            &self.data,
            &self.shape,
            &mut out,
            dims,
            self.dtype.size(),
            Direction::OutOf,
        );
        Tensor::new(self.dtype, dims.to_vec(), Bytes::from(out))
    }
}

enum Direction {
    /// The small tensor is copied into the corner of the big one.
    Into,
    /// The corner of the big tensor is copied out into the small one.
    OutOf,
}

/// Copies the leading corner shared by `small_shape` and `big_shape` between `src` and `dst`,
/// one contiguous last-dimension run at a time.
fn copy_region(
    src: &[u8],
    src_shape: &[usize],
    dst: &mut [u8],
    dst_shape: &[usize],
    size: usize,
    dir: Direction,
) {
    let (small, big) = match dir {
        Direction::Into => (src_shape, dst_shape),
        Direction::OutOf => (dst_shape, src_shape),
    };
    let rank = small.len();
    if rank == 0 || small.contains(&0) {
        if rank == 0 {
            dst[..size].copy_from_slice(&src[..size]);
        }
        return;
    }
    let strides = |shape: &[usize]| -> Vec<usize> {
        let mut s = vec![1; shape.len()];
        for d in (0..shape.len() - 1).rev() {
            s[d] = s[d + 1] * shape[d + 1];
        }
        s
    };
    let (ss, bs) = (strides(small), strides(big));
    let run = small[rank - 1] * size;
    let mut index = vec![0usize; rank - 1];
    loop {
        let so: usize = index.iter().zip(&ss).map(|(i, s)| i * s).sum::<usize>() * size;
        let bo: usize = index.iter().zip(&bs).map(|(i, s)| i * s).sum::<usize>() * size;
        match dir {
            Direction::Into => dst[bo..bo + run].copy_from_slice(&src[so..so + run]),
            Direction::OutOf => dst[so..so + run].copy_from_slice(&src[bo..bo + run]),
        }
        // Next index over the outer dimensions of the small shape.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < small[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// One element of `dtype` holding `value`, little-endian.
fn encode(dtype: DataType, value: f64) -> Vec<u8> {
    match dtype {
        DataType::Bool => vec![u8::from(value != 0.0)],
        DataType::U8 => vec![value as u8],
        DataType::I8 => (value as i8).to_le_bytes().to_vec(),
        DataType::U16 => (value as u16).to_le_bytes().to_vec(),
        DataType::I16 => (value as i16).to_le_bytes().to_vec(),
        DataType::U32 => (value as u32).to_le_bytes().to_vec(),
        DataType::I32 => (value as i32).to_le_bytes().to_vec(),
        DataType::U64 => (value as u64).to_le_bytes().to_vec(),
        DataType::I64 => (value as i64).to_le_bytes().to_vec(),
        DataType::F16 => half::f16::from_f64(value).to_le_bytes().to_vec(),
        DataType::BF16 => half::bf16::from_f64(value).to_le_bytes().to_vec(),
        DataType::F32 => (value as f32).to_le_bytes().to_vec(),
        DataType::F64 => value.to_le_bytes().to_vec(),
        // An empty string: its length, 0.
        DataType::Bytes => vec![0; 4],
    }
}

/// Where each of the first `count` length-prefixed elements of `data` ends; `None` when `data`
/// holds fewer.
fn element_ends(data: &[u8], count: usize) -> Option<Vec<usize>> {
    // Each element takes at least its 4-byte length: a count past that is refused before
    // anything is allocated.
    if count > data.len() / 4 {
        return None;
    }
    let mut ends = Vec::with_capacity(count);
    let mut at = 0usize;
    for _ in 0..count {
        let len = data.get(at..at + 4)?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        at = at.checked_add(4 + len).filter(|&end| end <= data.len())?;
        ends.push(at);
    }
    Some(ends)
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

    fn strings(items: &[&[&str]]) -> Tensor {
        let mut data = Vec::new();
        for item in items {
            for s in *item {
                data.extend_from_slice(&(s.len() as u32).to_le_bytes());
                data.extend_from_slice(s.as_bytes());
            }
        }
        Tensor::new(
            DataType::Bytes,
            vec![items.len(), items[0].len()],
            Bytes::from(data),
        )
        .unwrap()
    }

    #[test]
    fn bytes_tensors_batch_slice_and_pad_by_element() {
        let a = strings(&[&["a", "bcd"], &["", "ef"]]);
        let b = strings(&[&["ghij", "k"]]);
        let joined = Tensor::concat(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(joined.shape(), [3, 2]);
        assert_eq!(joined.slice_items(0, 2), a);
        assert_eq!(joined.slice_items(2, 1), b);
        assert_eq!(joined.slice_items(1, 1), strings(&[&["", "ef"]]));
        let padded = b.clone().pad_items(2).unwrap();
        assert_eq!(padded.slice_items(1, 1), strings(&[&["", ""]]));
        // Data that does not hold the shape's elements is refused.
        for bad in [vec![1, 0, 0, 0], vec![9, 0, 0, 0, b'x'], vec![]] {
            assert!(Tensor::new(DataType::Bytes, vec![1], Bytes::from(bad)).is_err());
        }
        assert!(Tensor::new(DataType::Bytes, vec![0], Bytes::new()).is_ok());
        assert!(Tensor::new(DataType::Bytes, vec![usize::MAX, 2], Bytes::new()).is_err());
    }

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
    fn pad_to_then_crop_gives_back_the_tensor() {
        let data: Vec<u8> = [1i32, 2, 3, 4, 5, 6]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let small = Tensor::new(DataType::I32, vec![1, 2, 3], Bytes::from(data)).unwrap();
        let big = small.pad_to(&[1, 3, 4], -1.0).unwrap();
        let values: Vec<i32> = big
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(values, [1, 2, 3, -1, 4, 5, 6, -1, -1, -1, -1, -1]);
        assert_eq!(big.crop(&[1, 2, 3]).unwrap(), small);
        assert!(small.pad_to(&[1, 1, 3], 0.0).is_err());
    }

    #[test]
    fn leading_rows_of_one_item_are_cropped_without_a_copy() {
        let values = |t: &Tensor| -> Vec<i32> {
            t.data()
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let tensor = |shape: Vec<usize>| {
            let n: usize = shape.iter().product();
            let data: Vec<u8> = (0..n as i32).flat_map(|v| v.to_le_bytes()).collect();
            Tensor::new(DataType::I32, shape, Bytes::from(data)).unwrap()
        };
        // One item's first two of three tokens: the bytes' first run, shared.
        let one = tensor(vec![1, 3, 2]);
        let rows = one.crop(&[1, 2, 2]).unwrap();
        assert_eq!(values(&rows), [0, 1, 2, 3]);
        assert_eq!(rows.data().as_ptr(), one.data().as_ptr());
        // Two items' first two tokens each: two runs, copied.
        let two = tensor(vec![2, 3, 2]);
        let rows = two.crop(&[2, 2, 2]).unwrap();
        assert_eq!(values(&rows), [0, 1, 2, 3, 6, 7, 8, 9]);
        assert_ne!(rows.data().as_ptr(), two.data().as_ptr());
        // A cut past the first dimension cut is not one run either.
        assert_eq!(values(&one.crop(&[1, 2, 1]).unwrap()), [0, 2]);
    }

    #[test]
    fn concat_rejects_mismatched_item_shapes() {
        let other = Tensor::new(DataType::U8, vec![1, 3], Bytes::from(vec![0u8; 3])).unwrap();
        assert!(Tensor::concat(&[t(1, 0), other]).is_err());
    }
}
