//! Reads and writes of buffers by the emitter: element addresses, loads
//! (one element, four contiguous lanes, every other element, 16-bit
//! values, bytes, padded), a gather's read at the position its index picks,
//! splats and stores.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{ConstantData, Endianness, InstBuilder, MemFlagsData, Value, types};
use kiln_ir::DType;
use kiln_ir::kernel::gather_fill;

use super::clif_type;
use super::emit::{Emitter, Pick, RowBase};
use crate::nest::Access;

impl Emitter<'_> {
    pub(super) fn address(&mut self, buffer: usize, offset: Value, dtype: DType) -> Value {
        let bytes = self.b.ins().imul_imm_s(offset, dtype.size() as i64);
        self.b.ins().iadd(self.ptrs[buffer], bytes)
    }

    /// One element (or four lanes) of `access` at `j`.
    pub(super) fn load(
        &mut self,
        access: &Access,
        row: RowBase,
        j: Value,
        dtype: DType,
        lanes: bool,
    ) -> Value {
        let at = self.element(access, row, j);
        self.load_at(access, at, dtype, lanes)
    }

    /// One element (or four lanes) of a gather (`Expr::Gather`) at `j`: of
    /// `access` moved along the gathered axis to where `pick` points, or
    /// the gather's fill where it points outside the axis.
    pub(super) fn gathered(
        &mut self,
        access: &Access,
        row: RowBase,
        j: Value,
        lanes: bool,
        pick: Pick,
    ) -> Value {
        let Pick {
            dtype,
            index,
            stride,
            len,
        } = pick;
        // One outside the axis reads its first element (inside the
        // buffer), replaced by the fill.
        let (position, inside) = self.position(index, len);
        let (offset, valid) = self.element(access, row, j);
        let shift = self.b.ins().imul_imm_s(position, stride as i64);
        let offset = self.b.ins().iadd(offset, shift);
        let x = self.load_at(access, (offset, valid), dtype, lanes);
        let fill = self.scalar_const(gather_fill(dtype));
        let fill = if lanes { self.splat(dtype, fill) } else { fill };
        self.b.ins().select(inside, x, fill)
    }

    /// The position an i32 or i64 `index` picks along an axis of `len`,
    /// counted from the end when negative, as an i64 clamped to 0 where the
    /// index is outside `-len..len`; and whether it was inside.
    pub(super) fn position(&mut self, index: Value, len: usize) -> (Value, Value) {
        let index = match self.b.func.dfg.value_type(index) {
            types::I64 => index,
            _ => self.b.ins().sextend(types::I64, index),
        };
        let negative = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, index, 0);
        let wrapped = self.b.ins().iadd_imm_s(index, len as i64);
        let position = self.b.ins().select(negative, wrapped, index);
        let inside = self
            .b
            .ins()
            .icmp_imm_s(IntCC::UnsignedLessThan, position, len as i64);
        let zero = self.iconst(0);
        (self.b.ins().select(inside, position, zero), inside)
    }

    /// One element (or four lanes) of `access` at element `offset`, `valid`
    /// saying whether it reads the buffer there: outside the valid ranges,
    /// the padding's `fill`; over a row of padding of an access cut to its
    /// unpadded middle, its `row_fill` (the load itself of the clamped row,
    /// inside the buffer).
    pub(super) fn load_at(
        &mut self,
        access: &Access,
        (offset, valid): (Value, Option<Value>),
        dtype: DType,
        lanes: bool,
    ) -> Value {
        let (x, four) = self.load_raw(access, offset, dtype, lanes);
        let x = match (valid, access.fill.or(access.row_fill)) {
            (Some(ok), Some(fill)) => {
                let f = self.scalar_const(fill);
                let f = if four { self.splat(dtype, f) } else { f };
                self.b.ins().select(ok, x, f)
            }
            _ => x,
        };
        if lanes && !four {
            self.splat(dtype, x)
        } else {
            x
        }
    }

    /// The value at element `offset` of `access` as loaded: four lanes where
    /// the access steps through them (contiguously, or every other element)
    /// and `lanes` asks for them, and whether it did; else one element.
    fn load_raw(
        &mut self,
        access: &Access,
        offset: Value,
        dtype: DType,
        lanes: bool,
    ) -> (Value, bool) {
        let flags = MemFlagsData::new().with_notrap();
        let addr = self.address(access.buffer, offset, dtype);
        if lanes && !self.row_lanes && access.stride_two() && dtype.size() == 4 {
            return (self.every_other(addr, dtype), true);
        }
        let contiguous = if self.row_lanes {
            access.outer.last().is_some_and(|o| o.stride == 1)
        } else {
            access.unit_stride()
        };
        if lanes && contiguous {
            let four = match dtype {
                DType::I32 => self.b.ins().load(types::I32X4, flags, addr, 0),
                DType::BF16 | DType::F16 => self.load_half(dtype, addr, true),
                DType::U8 | DType::Bool => {
                    // Four bytes, and no more: the row may end there.
                    let word = self.b.ins().load(types::I32, flags, addr, 0);
                    let v = self.b.ins().scalar_to_vector(types::I32X4, word);
                    let little = MemFlagsData::new().with_endianness(Endianness::Little);
                    let bytes = self.b.ins().bitcast(types::I8X16, little, v);
                    let halves = self.b.ins().uwiden_low(bytes);
                    let v = self.b.ins().uwiden_low(halves);
                    // A bool's 1 becomes a mask of ones.
                    match dtype {
                        DType::Bool => self.b.ins().ineg(v),
                        _ => v,
                    }
                }
                _ => self.b.ins().load(types::F32X4, flags, addr, 0),
            };
            return (four, true);
        }
        let x = if dtype.is_half() {
            self.load_half(dtype, addr, false)
        } else {
            self.b.ins().load(clif_type(dtype), flags, addr, 0)
        };
        (x, false)
    }

    /// Four lanes of 4-byte `dtype` from every other element from `addr`
    /// (elements 0, 2, 4, 6): lanes 0 and 2 of the vector at element 0 and
    /// lanes 1 and 3 of the one at element 3, so that the last element read
    /// is the last one wanted (never one past the row's end).
    fn every_other(&mut self, addr: Value, dtype: DType) -> Value {
        let flags = MemFlagsData::new().with_notrap();
        let ty = if dtype == DType::I32 {
            types::I32X4
        } else {
            types::F32X4
        };
        let low = self.b.ins().load(ty, flags, addr, 0);
        let high = self.b.ins().load(ty, flags, addr, 12);
        let little = MemFlagsData::new().with_endianness(Endianness::Little);
        let low = self.b.ins().bitcast(types::I8X16, little, low);
        let high = self.b.ins().bitcast(types::I8X16, little, high);
        // Bytes 0..16 name `low`'s, 16..32 `high`'s.
        let lanes: [u8; 4] = [0, 2, 5, 7];
        let bytes: Vec<u8> = (lanes.iter())
            .flat_map(|&l| (0..4).map(move |b| l * 4 + b))
            .collect();
        let mask = self.b.func.dfg.immediates.push(ConstantData::from(bytes));
        let picked = self.b.ins().shuffle(low, high, mask);
        self.b.ins().bitcast(ty, little, picked)
    }

    /// Scalar `x` of `dtype` in four lanes, as `has_lanes` holds them.
    pub(super) fn splat(&mut self, dtype: DType, x: Value) -> Value {
        match dtype {
            DType::I32 => self.b.ins().splat(types::I32X4, x),
            DType::U8 | DType::Bool => {
                let wide = self.b.ins().uextend(types::I32, x);
                let wide = match dtype {
                    DType::Bool => self.b.ins().ineg(wide),
                    _ => wide,
                };
                self.b.ins().splat(types::I32X4, wide)
            }
            _ => self.b.ins().splat(types::F32X4, x),
        }
    }

    pub(super) fn store(&mut self, access: &Access, row: RowBase, j: Value, x: Value) {
        let (offset, _) = self.element(access, row, j);
        self.store_at(access.buffer, offset, x);
    }

    /// `x` stored at element `offset` of output buffer `buffer`.
    pub(super) fn store_at(&mut self, buffer: usize, offset: Value, x: Value) {
        let dtype = self.out_dtype;
        let addr = self.address(buffer, offset, dtype);
        if dtype.is_half() {
            self.store_half(dtype, x, addr);
        } else {
            let flags = MemFlagsData::new().with_notrap();
            self.b.ins().store(flags, x, addr, 0);
        }
    }
}
