//! The protobuf wire format, read: a message is a run of (field number,
//! wire type, payload) records. `Reader` walks one message's records and
//! knows the absolute byte offset of each, so that a truncated or corrupt
//! file is an error naming where it breaks; `proto` gives the fields their
//! ONNX meaning.

/// A record that does not decode: where, in which message, and why.
#[derive(Debug)]
pub(super) struct DecodeError {
    /// Byte offset from the start of the file.
    pub offset: usize,
    /// What is wrong, naming the message and field.
    pub message: String,
}

pub(super) type Decoded<T> = Result<T, DecodeError>;

/// One field's payload, by wire type.
#[derive(Clone, Copy)]
pub(super) enum Payload<'a> {
    /// Wire type 0: an integer, or a bool or enum.
    Varint(u64),
    /// Wire type 1: eight little-endian bytes (a double).
    Fixed64(u64),
    /// Wire type 2: bytes, a string, a sub-message or a packed list.
    Bytes(&'a [u8]),
    /// Wire type 5: four little-endian bytes (a float).
    Fixed32(u32),
}

/// One field of a message.
#[derive(Clone, Copy)]
pub(super) struct Field<'a> {
    /// The field number of the `.proto`.
    pub number: u32,
    pub payload: Payload<'a>,
    /// The absolute offset of the payload's first byte.
    pub offset: usize,
}

/// The fields of one message, in file order.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The absolute offset of `buf[0]` in the file.
    base: usize,
    /// The message's name, for errors.
    message: &'static str,
}

impl<'a> Reader<'a> {
    /// The fields of `message` held by `buf`, which starts at absolute `base`.
    pub fn new(buf: &'a [u8], base: usize, message: &'static str) -> Reader<'a> {
        Reader {
            buf,
            pos: 0,
            base,
            message,
        }
    }

    /// The fields of a sub-message named `message` held by `field`.
    pub fn nested(field: &Field<'a>, outer: &'static str, message: &'static str) -> Decoded<Self> {
        let bytes = field.bytes(outer)?;
        Ok(Reader::new(bytes, field.offset, message))
    }

    fn error(&self, at: usize, what: String) -> DecodeError {
        DecodeError {
            offset: self.base + at,
            message: format!("{}: {what}", self.message),
        }
    }

    fn varint(&mut self) -> Decoded<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(self.error(start, "truncated varint".into()));
            };
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.error(start, "varint longer than 10 bytes".into()))
    }

    fn take(&mut self, n: usize, what: &str) -> Decoded<&'a [u8]> {
        let start = self.pos;
        let end = start
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| {
                self.error(
                    start,
                    format!(
                        "truncated {what}: {n} bytes announced, {} left",
                        self.buf.len() - start
                    ),
                )
            })?;
        self.pos = end;
        Ok(&self.buf[start..end])
    }

    /// The next field, or `None` at the message's end.
    pub fn next_field(&mut self) -> Decoded<Option<Field<'a>>> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let tag_at = self.pos;
        let tag = self.varint()?;
        let number = u32::try_from(tag >> 3)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| self.error(tag_at, format!("invalid field number in tag {tag}")))?;
        let offset = self.base + self.pos;
        let payload = match tag & 7 {
            0 => Payload::Varint(self.varint()?),
            1 => {
                let b = self.take(8, "fixed64")?;
                Payload::Fixed64(u64::from_le_bytes([
                    b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
                ]))
            }
            2 => {
                let len_at = self.pos;
                let len = usize::try_from(self.varint()?)
                    .map_err(|_| self.error(len_at, "length too large".into()))?;
                let what = format!("field {number}");
                let bytes = self.take(len, &what)?;
                return Ok(Some(Field {
                    number,
                    payload: Payload::Bytes(bytes),
                    offset: self.base + self.pos - len,
                }));
            }
            5 => {
                let b = self.take(4, "fixed32")?;
                Payload::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            wire => {
                return Err(self.error(
                    tag_at,
                    format!("field {number} has wire type {wire}, which ONNX never writes"),
                ));
            }
        };
        Ok(Some(Field {
            number,
            payload,
            offset,
        }))
    }
}

impl<'a> Field<'a> {
    fn error(&self, message: &str, what: &str) -> DecodeError {
        DecodeError {
            offset: self.offset,
            message: format!("{message} field {}: {what}", self.number),
        }
    }

    /// The payload as an integer (int32, int64, enum or bool).
    pub fn int(&self, message: &str) -> Decoded<i64> {
        match self.payload {
            Payload::Varint(v) => Ok(v as i64),
            _ => Err(self.error(message, "expected a varint")),
        }
    }

    /// The payload as bytes or a sub-message.
    pub fn bytes(&self, message: &str) -> Decoded<&'a [u8]> {
        match self.payload {
            Payload::Bytes(b) => Ok(b),
            _ => Err(self.error(message, "expected a length-delimited payload")),
        }
    }

    /// The payload as a UTF-8 string.
    pub fn string(&self, message: &str) -> Decoded<String> {
        String::from_utf8(self.bytes(message)?.to_vec())
            .map_err(|_| self.error(message, "string is not UTF-8"))
    }

    /// The payload as a float.
    pub fn float(&self, message: &str) -> Decoded<f32> {
        match self.payload {
            Payload::Fixed32(v) => Ok(f32::from_bits(v)),
            _ => Err(self.error(message, "expected a fixed32 float")),
        }
    }

    /// Appends the integers of a repeated integer field, packed or not
    /// (a parser must accept both).
    pub fn push_ints(&self, message: &'static str, out: &mut Vec<i64>) -> Decoded<()> {
        match self.payload {
            Payload::Varint(v) => out.push(v as i64),
            Payload::Bytes(_) => {
                let mut r = Reader::nested(self, message, message)?;
                while r.pos < r.buf.len() {
                    out.push(r.varint()? as i64);
                }
            }
            _ => return Err(self.error(message, "expected varints")),
        }
        Ok(())
    }

    /// Appends the values of a repeated float field, packed or not.
    pub fn push_floats(&self, message: &str, out: &mut Vec<f32>) -> Decoded<()> {
        match self.payload {
            Payload::Fixed32(v) => out.push(f32::from_bits(v)),
            Payload::Bytes(b) if b.len() % 4 == 0 => out.extend(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            _ => return Err(self.error(message, "expected packed floats")),
        }
        Ok(())
    }

    /// Appends the values of a repeated double field, packed or not.
    pub fn push_doubles(&self, message: &str, out: &mut Vec<f64>) -> Decoded<()> {
        match self.payload {
            Payload::Fixed64(v) => out.push(f64::from_bits(v)),
            Payload::Bytes(b) if b.len() % 8 == 0 => out.extend(
                b.chunks_exact(8)
                    .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
            ),
            _ => return Err(self.error(message, "expected packed doubles")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_varint_names_its_offset() {
        // Field 1, varint, whose continuation bit promises a byte that is missing.
        let bytes = [0x08, 0x96];
        let mut r = Reader::new(&bytes, 100, "ModelProto");
        let err = r.next_field().err().expect("truncated");
        assert_eq!(err.offset, 101);
        assert!(err.message.contains("truncated varint"), "{}", err.message);
    }

    #[test]
    fn a_length_past_the_end_is_an_error() {
        // Field 7, bytes of length 5, with 2 present.
        let bytes = [0x3a, 0x05, 1, 2];
        let mut r = Reader::new(&bytes, 0, "ModelProto");
        let err = r.next_field().err().expect("truncated");
        assert_eq!(err.offset, 2);
        assert!(
            err.message.contains("5 bytes announced, 2 left"),
            "{}",
            err.message
        );
    }

    #[test]
    fn packed_and_unpacked_ints_read_alike() -> Decoded<()> {
        // Field 1 unpacked: 3; field 1 packed: [150, 1].
        let bytes = [0x08, 0x03, 0x0a, 0x03, 0x96, 0x01, 0x01];
        let mut r = Reader::new(&bytes, 0, "TensorProto");
        let mut out = Vec::new();
        while let Some(f) = r.next_field()? {
            f.push_ints("TensorProto", &mut out)?;
        }
        assert_eq!(out, [3, 150, 1]);
        Ok(())
    }
}
