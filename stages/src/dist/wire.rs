//! Host bytes for what crosses a process boundary: little-endian u64 words and f32
//! elements, read back with every length checked.

use super::DistError;

/// A host tensor with a name: a parameter, an optimizer moment, a checkpoint entry.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Appends words and elements to a byte buffer.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u64(&mut self, x: u64) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }

    /// (index, value) pairs: per-parameter sums, per-microbatch losses.
    pub fn indexed(&mut self, pairs: &[(usize, f64)]) -> &mut Self {
        self.u64(pairs.len() as u64);
        for (i, x) in pairs {
            self.u64(*i as u64).u64(x.to_bits());
        }
        self
    }

    pub fn f32s(&mut self, data: &[f32]) -> &mut Self {
        self.u64(data.len() as u64);
        self.0.reserve(data.len() * 4);
        for x in data {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
}

/// Reads back what a [`Writer`] wrote; a short or malformed buffer is a protocol error.
pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DistError> {
        if self.0.len() < n {
            return Err(DistError::Protocol(format!("message ends {} bytes early", n - self.0.len())));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub fn u64(&mut self) -> Result<u64, DistError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn usize(&mut self) -> Result<usize, DistError> {
        Ok(self.u64()? as usize)
    }

    pub fn bytes(&mut self) -> Result<Vec<u8>, DistError> {
        let n = self.usize()?;
        Ok(self.take(n)?.to_vec())
    }

    pub fn indexed(&mut self) -> Result<Vec<(usize, f64)>, DistError> {
        (0..self.usize()?).map(|_| Ok((self.usize()?, f64::from_bits(self.u64()?)))).collect()
    }

    pub fn f32s(&mut self) -> Result<Vec<f32>, DistError> {
        let n = self.usize()?;
        let raw =
            self.take(n.checked_mul(4).ok_or_else(|| DistError::Protocol("length overflows".into()))?)?;
        Ok(raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
    }
}

pub fn encode_tensors(tensors: &[NamedTensor]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u64(tensors.len() as u64);
    for t in tensors {
        w.bytes(t.name.as_bytes()).u64(t.shape.len() as u64);
        for &d in &t.shape {
            w.u64(d as u64);
        }
        w.f32s(&t.data);
    }
    w.0
}

pub fn decode_tensors(bytes: &[u8]) -> Result<Vec<NamedTensor>, DistError> {
    let mut r = Reader(bytes);
    let n = r.usize()?;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let name = String::from_utf8(r.bytes()?).map_err(|e| DistError::Protocol(e.to_string()))?;
        let ndim = r.usize()?;
        let shape = (0..ndim).map(|_| r.usize()).collect::<Result<Vec<_>, _>>()?;
        let data = r.f32s()?;
        if data.len() != shape.iter().product::<usize>() {
            return Err(DistError::Protocol(format!("`{name}`: {} values for shape {shape:?}", data.len())));
        }
        out.push(NamedTensor { name, shape, data });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_round_trip_and_truncation_is_an_error() {
        let t = vec![
            NamedTensor { name: "h.0.attn.c_attn.weight".into(), shape: vec![2, 3], data: vec![1.5; 6] },
            NamedTensor { name: "wpe.weight".into(), shape: vec![1], data: vec![-0.0] },
        ];
        let bytes = encode_tensors(&t);
        assert_eq!(decode_tensors(&bytes).unwrap(), t);
        assert!(matches!(decode_tensors(&bytes[..bytes.len() - 1]), Err(DistError::Protocol(_))));
    }
}
