//! The C text that every generated kernel is made of: C types and
//! literals, the helper functions a kernel uses (emitted once, before it),
//! kernel and row-function signatures, coordinates from a flat index, and
//! a block of values (loads through views, casts, unary and binary ops)
//! with the interpreter's semantics.

use std::collections::BTreeSet;
use std::fmt::Write;

use kiln_ir::kernel::{Block, Expr, gather_fill};
use kiln_ir::view::View;
use kiln_ir::{BinaryOp, DType, Scalar, TensorType, UnaryOp};

use super::elementwise::{in_vectors, vector_lane};
use super::{ENTRY, Grid, Program};
use crate::Error;

/// The C type of a dtype's values in registers: 16-bit floats are held as
/// the float of their value, as on the CPU (`storage` gives their bits).
pub(super) fn ctype(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 => "unsigned char",
        DType::Bool => "bool",
    }
}

/// The C type of a dtype's elements in memory.
pub(super) fn storage(dtype: DType) -> &'static str {
    if dtype.is_half() {
        "unsigned short"
    } else {
        ctype(dtype)
    }
}

/// A constant as C, exact: floats print in their shortest round-trip form.
pub(super) fn literal(c: Scalar) -> String {
    match c {
        Scalar::F32(v) if v.is_finite() => format!("{v:?}f"),
        Scalar::F32(v) => format!("__int_as_float(0x{:08x})", v.to_bits()),
        Scalar::I32(v) if v == i32::MIN => "(-2147483647 - 1)".to_string(),
        Scalar::I32(v) => v.to_string(),
        Scalar::F64(v) if v.is_finite() => format!("{v:?}"),
        Scalar::F64(v) => format!("__longlong_as_double(0x{:016x}LL)", v.to_bits()),
        Scalar::I64(v) if v == i64::MIN => "(-9223372036854775807LL - 1)".to_string(),
        Scalar::I64(v) => format!("{v}LL"),
        Scalar::U8(v) => format!("(unsigned char){v}"),
        Scalar::Bool(v) => v.to_string(),
        // Held as floats: their exact f32 value.
        Scalar::BF16(v) => literal(Scalar::F32(v.to_f32())),
        Scalar::F16(v) => literal(Scalar::F32(v.to_f32())),
    }
}

/// The position index `i` picks along an axis of `len`: `i`, or `i + len`
/// when negative (still outside `0..len` for an index outside `-len..len`).
pub(super) fn position(i: &str, len: usize) -> String {
    format!("(long long){i} < 0 ? (long long){i} + {len} : (long long){i}")
}

/// Helper functions, emitted before the kernel when used.
const HELPERS: [(&str, &str); 13] = [
    (
        "kiln_bf16",
        "// bf16 bits and the float of their value; rounding to nearest even
// (PTX `cvt.rn`, which keeps NaN a NaN and overflows to infinity).
__device__ __forceinline__ float kiln_bf16_to_f32(unsigned short h) { return __uint_as_float((unsigned int)h << 16); }
__device__ __forceinline__ unsigned short kiln_f32_to_bf16(float x) {
  unsigned short h;
  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x));
  return h;
}
__device__ __forceinline__ float kiln_round_bf16(float x) { return kiln_bf16_to_f32(kiln_f32_to_bf16(x)); }
",
    ),
    (
        "kiln_f16",
        "// f16 bits and the float of their value, as kiln_bf16's.
__device__ __forceinline__ float kiln_f16_to_f32(unsigned short h) {
  float x;
  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(x) : \"h\"(h));
  return x;
}
__device__ __forceinline__ unsigned short kiln_f32_to_f16(float x) {
  unsigned short h;
  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x));
  return h;
}
__device__ __forceinline__ float kiln_round_f16(float x) { return kiln_f16_to_f32(kiln_f32_to_f16(x)); }
",
    ),
    (
        "kiln_d2f_odd",
        "// A double as float rounded to odd: toward zero, the last bit set where
// that dropped anything; rounded again to 16 bits, the direct rounding.
__device__ __forceinline__ float kiln_d2f_odd(double x) {
  float r = __double2float_rz(x);
  if ((double)r != x && r == r) r = __uint_as_float(__float_as_uint(r) | 1u);
  return r;
}
",
    ),
    (
        "kiln_max",
        "// IEEE maximum: NaN if either is, +0 above -0.
__device__ __forceinline__ float kiln_max(float a, float b) {
  if (a != a || b != b) return __int_as_float(0x7fc00000);
  if (a == b) return __float_as_int(a) < 0 ? b : a;
  return a > b ? a : b;
}
",
    ),
    (
        "kiln_min",
        "__device__ __forceinline__ float kiln_min(float a, float b) { return -kiln_max(-a, -b); }
",
    ),
    (
        "kiln_f2i",
        "// Saturating, NaN to 0, as Rust's `as`.
__device__ __forceinline__ int kiln_f2i(float x) {
  return x != x ? 0 : x >= 2147483648.0f ? 2147483647 : x <= -2147483648.0f ? (-2147483647 - 1) : (int)x;
}
",
    ),
    (
        "kiln_f2u8",
        "__device__ __forceinline__ unsigned char kiln_f2u8(float x) {
  return x != x ? 0 : x >= 255.0f ? 255 : x <= 0.0f ? 0 : (unsigned char)x;
}
",
    ),
    (
        "kiln_maxd",
        "// IEEE maximum of doubles: NaN if either is, +0 above -0.
__device__ __forceinline__ double kiln_maxd(double a, double b) {
  if (a != a || b != b) return __longlong_as_double(0x7ff8000000000000LL);
  if (a == b) return __double_as_longlong(a) < 0 ? b : a;
  return a > b ? a : b;
}
",
    ),
    (
        "kiln_mind",
        "__device__ __forceinline__ double kiln_mind(double a, double b) { return -kiln_maxd(-a, -b); }
",
    ),
    (
        "kiln_d2i",
        "// Saturating, NaN to 0, as Rust's `as` (floats widen to double exactly).
__device__ __forceinline__ int kiln_d2i(double x) {
  return x != x ? 0 : x >= 2147483647.0 ? 2147483647 : x <= -2147483648.0 ? (-2147483647 - 1) : (int)x;
}
",
    ),
    (
        "kiln_d2l",
        "__device__ __forceinline__ long long kiln_d2l(double x) {
  return x != x ? 0 : x >= 9223372036854775808.0 ? 9223372036854775807LL : x <= -9223372036854775808.0 ? (-9223372036854775807LL - 1) : (long long)x;
}
",
    ),
    (
        "kiln_uniform",
        "// Threefry-2x32-20 of (ctr, 0) under (key, 0), the top 24 bits of its
// first word as a float in [0, 1): kiln_ir::random::uniform, bit for bit.
__device__ __forceinline__ float kiln_uniform(int key, int ctr) {
  const unsigned int r[8] = {13u, 15u, 26u, 6u, 17u, 29u, 16u, 24u};
  const unsigned int ks[3] = {(unsigned int)key, 0u, 0x1BD11BDAu ^ (unsigned int)key};
  unsigned int x0 = (unsigned int)ctr + ks[0], x1 = ks[1];
#pragma unroll
  for (int i = 0; i < 20; i++) {
    x0 += x1;
    x1 = ((x1 << r[i % 8]) | (x1 >> (32u - r[i % 8]))) ^ x0;
    if (i % 4 == 3) {
      unsigned int s = i / 4 + 1;
      x0 += ks[s % 3];
      x1 += ks[(s + 1) % 3] + s;
    }
  }
  return (float)(x0 >> 8) * 5.9604644775390625e-8f;
}
",
    ),
    (
        "kiln_d2u8",
        "__device__ __forceinline__ unsigned char kiln_d2u8(double x) {
  return x != x ? 0 : x >= 255.0 ? 255 : x <= 0.0 ? 0 : (unsigned char)x;
}
",
    ),
];

/// How the values of one block are named and where its loads and `acc` come
/// from, for one element.
pub(super) struct Element<'a> {
    /// Suffix of every value's name (a vector lane's, or empty).
    pub(super) suffix: &'a str,
    /// The element's flat index in the block's space.
    pub(super) index: &'a str,
    /// Prefix of its coordinate variables.
    pub(super) coords: &'a str,
    /// The vector lane (`x`, `y`, `z`, `w`) whose vector loads serve
    /// contiguous reads of f32 and 16-bit floats (`elementwise::in_vectors`).
    pub(super) lane: Option<char>,
    /// The expression of `acc`.
    pub(super) acc: Option<&'a str>,
}

/// Writes generated code and remembers the helpers it used.
pub(super) struct Writer {
    code: String,
    /// The `HELPERS` it used, by name.
    pub(super) helpers: BTreeSet<&'static str>,
}

impl Writer {
    pub(super) fn new() -> Writer {
        Writer {
            code: String::new(),
            helpers: BTreeSet::new(),
        }
    }

    pub(super) fn line(&mut self, indent: usize, text: &str) {
        let _ = writeln!(self.code, "{:indent$}{text}", "", indent = indent * 2);
    }

    /// The finished program: helpers, then the kernel.
    pub(super) fn finish(self, grid: Grid) -> Program {
        let mut code = String::new();
        for (name, text) in HELPERS {
            if self.helpers.contains(name) {
                code.push_str(text);
            }
        }
        code.push_str(&self.code);
        Program { code, grid }
    }

    /// `extern "C" __global__ void kiln_kernel(...) {`: the inputs, `acc`
    /// if asked, the output and `side` side outputs of its type.
    pub(super) fn signature(&mut self, inputs: &[TensorType], acc: bool, out: DType, side: usize) {
        let mut params: Vec<String> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| format!("const {}* __restrict__ in{i}", storage(t.dtype)))
            .collect();
        if acc {
            params.push("const float* __restrict__ acc".to_string());
        }
        params.push(format!("{}* __restrict__ out", storage(out)));
        params.extend((0..side).map(|k| format!("{}* __restrict__ side{k}", storage(out))));
        self.line(
            0,
            &format!(
                "extern \"C\" __global__ void {ENTRY}({}) {{",
                params.join(", ")
            ),
        );
    }

    /// `__device__ void {name}(long long o, ...) {`: one row of a row
    /// group. Inputs marked in `written` were written by an earlier function
    /// of the group in this kernel, by another thread: they are read as
    /// `volatile`, from where the write went, never through `__restrict__`'s
    /// non-coherent read-only path, a copy the compiler keeps, or a line the
    /// multiprocessor's L1 holds from before the write. (A warp-per-row
    /// variant reading them as plain `const` pointers after `__syncwarp`
    /// read stale values on the H100: layer_norm's mean, rows of 3.)
    pub(super) fn row_signature(
        &mut self,
        name: &str,
        inputs: &[TensorType],
        written: &[bool],
        out: DType,
    ) {
        let mut params = vec!["const long long o".to_string()];
        params.extend(inputs.iter().enumerate().map(|(i, t)| {
            let t = storage(t.dtype);
            if written.get(i) == Some(&true) {
                format!("const volatile {t}* in{i}")
            } else {
                format!("const {t}* __restrict__ in{i}")
            }
        }));
        params.push(format!("{}* __restrict__ out", storage(out)));
        self.line(
            0,
            &format!(
                "__device__ __forceinline__ void {name}({}) {{",
                params.join(", ")
            ),
        );
    }

    /// `const long long {prefix}{axis} = ...;` for every axis of `dims`
    /// from the flat index `index` (row-major over `dims`).
    pub(super) fn coords(
        &mut self,
        indent: usize,
        prefix: &str,
        index: &str,
        dims: &[(usize, usize)],
    ) {
        let mut inner = 1usize;
        for (k, &(axis, dim)) in dims.iter().enumerate().rev() {
            let q = if inner == 1 {
                index.to_string()
            } else {
                format!("{index} / {inner}")
            };
            let expr = if k == 0 { q } else { format!("({q}) % {dim}") };
            self.line(indent, &format!("const long long {prefix}{axis} = {expr};"));
            inner *= dim;
        }
    }

    /// The values of `block` for one element; returns the result's name.
    pub(super) fn block(
        &mut self,
        indent: usize,
        block: &Block,
        inputs: &[TensorType],
        at: &Element,
    ) -> Result<String, Error> {
        let name = |k: u32| format!("v{k}{}", at.suffix);
        for (k, value) in block.values.iter().enumerate() {
            let ty = value.dtype;
            let operand_type = |x: u32| block.values[x as usize].dtype;
            let expr = match &value.expr {
                Expr::Load { input, view } => {
                    let dtype = inputs
                        .get(*input as usize)
                        .map(|t| t.dtype)
                        .ok_or_else(|| crate::codegen("CUDA C", format!("no input {input}")))?;
                    self.load(*input, view, dtype, at)
                }
                Expr::Gather {
                    input,
                    view,
                    index,
                    stride,
                    len,
                } => {
                    // The position, from the end when negative; outside the
                    // axis the read is not made and the fill stands in.
                    let p = format!("p{k}{}", at.suffix);
                    let picked = position(&name(*index), *len);
                    self.line(indent, &format!("const long long {p} = {picked};"));
                    let read = self.read(*input, view, ty, at, &format!("{p} * {stride}"));
                    let fill = literal(gather_fill(ty));
                    format!("({p} >= 0 && {p} < {len}) ? {read} : {fill}")
                }
                Expr::Const(c) => literal(*c),
                Expr::Acc => at
                    .acc
                    .ok_or_else(|| crate::codegen("CUDA C", "acc outside a reduction or matmul"))?
                    .to_string(),
                // `pass::widen` leaves no arithmetic on 16-bit floats; were
                // there any, its result would round as the interpreter's.
                Expr::Unary(op, x) if ty.is_half() => {
                    let r = self.unary(*op, &name(*x), ty)?;
                    self.cast(&r, DType::F32, ty)
                }
                Expr::Binary(op, x, y) if ty.is_half() => {
                    let r = self.binary(*op, &name(*x), &name(*y), operand_type(*x))?;
                    self.cast(&r, DType::F32, ty)
                }
                Expr::Unary(op, x) => self.unary(*op, &name(*x), ty)?,
                Expr::Binary(op, x, y) => {
                    self.binary(*op, &name(*x), &name(*y), operand_type(*x))?
                }
                Expr::Where(c, x, y) => format!("{} ? {} : {}", name(*c), name(*x), name(*y)),
                Expr::Cast(x) => self.cast(&name(*x), operand_type(*x), ty),
            };
            self.line(
                indent,
                &format!("const {} {} = {expr};", ctype(ty), name(k as u32)),
            );
        }
        Ok(name(block.values.len().saturating_sub(1) as u32))
    }

    /// A read of input `input` through `view`.
    fn load(&mut self, input: u32, view: &View, dtype: DType, at: &Element) -> String {
        if view.is_contiguous() {
            let element = match at.lane {
                Some(lane) if in_vectors(dtype) => vector_lane(input, dtype, lane),
                _ => format!("in{input}[{}]", at.index),
            };
            return self.widened(dtype, &element);
        }
        self.read(input, view, dtype, at, "")
    }

    /// An element of `dtype` read from memory (`element`), as registers
    /// hold it: 16-bit floats as the float of their value.
    fn widened(&mut self, dtype: DType, element: &str) -> String {
        match dtype {
            DType::BF16 => {
                self.helpers.insert("kiln_bf16");
                format!("kiln_bf16_to_f32({element})")
            }
            DType::F16 => {
                self.helpers.insert("kiln_f16");
                format!("kiln_f16_to_f32({element})")
            }
            _ => element.to_string(),
        }
    }

    /// Value `v` of `dtype` as memory holds it: a 16-bit float's bits (its
    /// value is one already, so this only narrows).
    pub(super) fn stored(&mut self, dtype: DType, v: &str) -> String {
        match dtype {
            DType::BF16 => {
                self.helpers.insert("kiln_bf16");
                format!("kiln_f32_to_bf16({v})")
            }
            DType::F16 => {
                self.helpers.insert("kiln_f16");
                format!("kiln_f32_to_f16({v})")
            }
            _ => v.to_string(),
        }
    }

    /// A read of input `input` (of `dtype`) through `view` at the element's
    /// coordinates, `shift` elements further on (none when empty).
    fn read(&mut self, input: u32, view: &View, dtype: DType, at: &Element, shift: &str) -> String {
        let mut index = if view.offset == 0 {
            String::new()
        } else {
            view.offset.to_string()
        };
        for (axis, &stride) in view.strides.iter().enumerate() {
            if stride != 0 {
                if !index.is_empty() {
                    index.push_str(" + ");
                }
                let _ = write!(index, "{}{axis} * {stride}", at.coords);
            }
        }
        if !shift.is_empty() {
            if !index.is_empty() {
                index.push_str(" + ");
            }
            index.push_str(shift);
        }
        if index.is_empty() {
            index.push('0');
        }
        let read = self.widened(dtype, &format!("in{input}[{index}]"));
        let Some(mask) = &view.mask else {
            return read;
        };
        let dims = view.shape.dims();
        let conditions: Vec<String> = mask
            .valid
            .iter()
            .enumerate()
            .filter(|&(a, &(lo, hi))| (lo, hi) != (0, dims[a]))
            .map(|(a, &(lo, hi))| {
                let c = format!("{}{a}", at.coords);
                match (lo, hi) {
                    (0, hi) => format!("{c} < {hi}"),
                    (lo, hi) if hi == dims[a] => format!("{c} >= {lo}"),
                    (lo, hi) => format!("{c} >= {lo} && {c} < {hi}"),
                }
            })
            .collect();
        if conditions.is_empty() {
            return read;
        }
        format!(
            "({}) ? {read} : {}",
            conditions.join(" && "),
            literal(mask.fill)
        )
    }

    fn unary(&mut self, op: UnaryOp, x: &str, ty: DType) -> Result<String, Error> {
        // `pass::widen` leaves no arithmetic on 16-bit floats; held as
        // floats, they would compute as f32.
        if ty == DType::F32 || ty.is_half() {
            return Ok(match op {
                UnaryOp::Detach => x.to_string(),
                UnaryOp::Neg => format!("-{x}"),
                UnaryOp::Exp => format!("expf({x})"),
                UnaryOp::Log => format!("logf({x})"),
                UnaryOp::Sqrt => format!("sqrtf({x})"),
                UnaryOp::Recip => format!("1.0f / {x}"),
                // NaN stays NaN; -0 and everything below 0 become +0.
                UnaryOp::Relu => format!("({x} > 0.0f || {x} != {x}) ? {x} : 0.0f"),
                UnaryOp::Sigmoid => format!("1.0f / (1.0f + expf(-{x}))"),
                UnaryOp::Tanh => format!("tanhf({x})"),
                UnaryOp::Trig(t) => format!("{}f({x})", t.name()),
                UnaryOp::Abs => format!("fabsf({x})"),
            });
        }
        if ty == DType::F64 {
            return Ok(match op {
                UnaryOp::Detach => x.to_string(),
                UnaryOp::Neg => format!("-{x}"),
                UnaryOp::Exp => format!("exp({x})"),
                UnaryOp::Log => format!("log({x})"),
                UnaryOp::Sqrt => format!("sqrt({x})"),
                UnaryOp::Recip => format!("1.0 / {x}"),
                UnaryOp::Relu => format!("({x} > 0.0 || {x} != {x}) ? {x} : 0.0"),
                UnaryOp::Sigmoid => format!("1.0 / (1.0 + exp(-{x}))"),
                UnaryOp::Tanh => format!("tanh({x})"),
                UnaryOp::Trig(t) => format!("{}({x})", t.name()),
                UnaryOp::Abs => format!("fabs({x})"),
            });
        }
        let wide = widen(x, ty);
        Ok(match op {
            UnaryOp::Detach => x.to_string(),
            UnaryOp::Neg => wrap(&format!("-{wide}"), ty),
            UnaryOp::Abs => wrap(&format!("({x} < 0 ? -{wide} : {wide})"), ty),
            UnaryOp::Relu => format!("{x} > 0 ? {x} : 0"),
            _ => {
                return Err(crate::codegen(
                    "CUDA C",
                    format!("{} of {ty} is not typed", op.name()),
                ));
            }
        })
    }

    fn binary(&mut self, op: BinaryOp, x: &str, y: &str, ty: DType) -> Result<String, Error> {
        let infix = |sign: &str| format!("{x} {sign} {y}");
        if op == BinaryOp::Uniform {
            self.helpers.insert("kiln_uniform");
            return Ok(format!("kiln_uniform({x}, {y})"));
        }
        if op.is_comparison() {
            return Ok(match op {
                BinaryOp::Lt => infix("<"),
                BinaryOp::Le => infix("<="),
                BinaryOp::Gt => infix(">"),
                BinaryOp::Ge => infix(">="),
                BinaryOp::Eq => infix("=="),
                _ => infix("!="),
            });
        }
        if ty.is_float() {
            let (max, min) = match ty {
                DType::F64 => ("kiln_maxd", "kiln_mind"),
                _ => ("kiln_max", "kiln_min"),
            };
            return Ok(match op {
                BinaryOp::Add => infix("+"),
                BinaryOp::Sub => infix("-"),
                BinaryOp::Mul => infix("*"),
                BinaryOp::Div => infix("/"),
                BinaryOp::Max => {
                    self.helpers.insert(max);
                    format!("{max}({x}, {y})")
                }
                BinaryOp::Min => {
                    self.helpers.extend([max, min]);
                    format!("{min}({x}, {y})")
                }
                // f32's pow in double, as the interpreter computes it.
                BinaryOp::Pow if ty != DType::F64 => {
                    format!("(float)pow((double){x}, (double){y})")
                }
                BinaryOp::Pow => format!("pow({x}, {y})"),
                // Exact, as the interpreter's.
                BinaryOp::Rem if ty != DType::F64 => format!("fmodf({x}, {y})"),
                BinaryOp::Rem => format!("fmod({x}, {y})"),
                _ => {
                    return Err(crate::codegen(
                        "CUDA C",
                        format!("{} is not arithmetic", op.name()),
                    ));
                }
            });
        }
        let wide = |sign: &str| wrap(&format!("{} {sign} {}", widen(x, ty), widen(y, ty)), ty);
        Ok(match op {
            BinaryOp::Add => wide("+"),
            BinaryOp::Sub => wide("-"),
            BinaryOp::Mul => wide("*"),
            BinaryOp::Max => format!("{x} > {y} ? {x} : {y}"),
            BinaryOp::Min => format!("{x} < {y} ? {x} : {y}"),
            // 0 by 0, and by -1 (whose remainder it is; `MIN % -1` is
            // undefined in C), as the interpreter's.
            BinaryOp::Rem if ty == DType::U8 => format!("{y} == 0 ? 0 : {x} % {y}"),
            BinaryOp::Rem => format!("{y} == 0 || {y} == -1 ? 0 : {x} % {y}"),
            _ => {
                return Err(crate::codegen(
                    "CUDA C",
                    format!("{} of {ty} is not typed", op.name()),
                ));
            }
        })
    }

    fn cast(&mut self, x: &str, from: DType, to: DType) -> String {
        match (from, to) {
            (a, b) if a == b => x.to_string(),
            // A 16-bit value is its float: exactly that, then on from f32.
            (DType::BF16 | DType::F16, to) => self.cast(x, DType::F32, to),
            (DType::F32, to @ (DType::BF16 | DType::F16)) => {
                let (helper, round) = half_helpers(to);
                self.helpers.insert(helper);
                format!("{round}({x})")
            }
            // Through a double rounded to odd, so that rounding happens once;
            // integers through double, which holds them up to 2^53.
            (from, to @ (DType::BF16 | DType::F16)) => {
                let (helper, round) = half_helpers(to);
                self.helpers.extend([helper, "kiln_d2f_odd"]);
                let wide = if from == DType::F64 {
                    x.to_string()
                } else {
                    format!("(double){x}")
                };
                format!("{round}(kiln_d2f_odd({wide}))")
            }
            (_, DType::Bool) => format!("{x} != 0"),
            (DType::F32, DType::I32) => {
                self.helpers.insert("kiln_f2i");
                format!("kiln_f2i({x})")
            }
            (DType::F32, DType::U8) => {
                self.helpers.insert("kiln_f2u8");
                format!("kiln_f2u8({x})")
            }
            (DType::F64, DType::I32) => {
                self.helpers.insert("kiln_d2i");
                format!("kiln_d2i({x})")
            }
            (DType::F32 | DType::F64, DType::I64) => {
                self.helpers.insert("kiln_d2l");
                format!("kiln_d2l((double){x})")
            }
            (DType::F64, DType::U8) => {
                self.helpers.insert("kiln_d2u8");
                format!("kiln_d2u8({x})")
            }
            // Narrower integers wrap, through the unsigned type C defines it for.
            (DType::I64, DType::I32) => format!("(int)(unsigned int){x}"),
            (_, to) => format!("({}){x}", ctype(to)),
        }
    }
}

/// The helper group of a 16-bit float type and its rounding function.
fn half_helpers(dtype: DType) -> (&'static str, &'static str) {
    if dtype == DType::BF16 {
        ("kiln_bf16", "kiln_round_bf16")
    } else {
        ("kiln_f16", "kiln_round_f16")
    }
}

/// An integer operand widened for arithmetic that `wrap` brings back: to
/// `long long` (exact for the 32-bit and narrower types), or for i64 to
/// `unsigned long long`, whose arithmetic wraps where signed overflow would
/// be undefined.
pub(super) fn widen(x: &str, ty: DType) -> String {
    if ty == DType::I64 {
        format!("(unsigned long long){x}")
    } else {
        format!("(long long){x}")
    }
}

/// An integer result computed in `long long`, wrapped to `ty`.
pub(super) fn wrap(wide: &str, ty: DType) -> String {
    match ty {
        DType::I32 => format!("(int)(unsigned int)({wide})"),
        DType::I64 => format!("(long long)({wide})"),
        DType::U8 => format!("(unsigned char)({wide})"),
        _ => format!("({wide}) != 0"),
    }
}
