use kiln_machine::gemm::{bf16_gemm, sgemm, Axis, Matrix, Product, Fused};
use kiln_machine::Isa;
use std::time::Instant;

fn med(mut f: impl FnMut(), reps: usize) -> f64 {
    let mut t = vec![];
    for _ in 0..reps { let s = Instant::now(); f(); t.push(s.elapsed().as_secs_f64() * 1e3); }
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[reps / 2]
}

fn main() {
    let isa = Isa::Avx2;
    let threads: usize = std::env::var("T").map(|t| t.parse().unwrap()).unwrap_or(2);
    for &(m, k, n) in &[(1, 1280, 1000), (8, 256, 1024), (256, 256, 256), (64, 784, 256), (250, 784, 256), (1024, 1024, 1024), (4096, 784, 256)] {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 97) as f32 / 13.0 - 3.0)).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 7717 % 89) as f32 / 13.0 - 3.0)).collect();
        let ah: Vec<u16> = a.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        let bh: Vec<u16> = b.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        let mut c = vec![0f32; m * n];
        let s = |len, stride| Axis::Strided { len, stride };
        let reps = if m * n * k > 1 << 28 { 10 } else { 200 };
        let f = med(|| {
            let p = Product { a: Matrix { data: &a, offset: 0, rows: s(m, k as isize), cols: s(k, 1) },
                              b: Matrix { data: &b, offset: 0, rows: s(k, n as isize), cols: s(n, 1) }, fused: Fused::default() };
            sgemm(isa, p, &mut c, threads, &|_, _| {}).unwrap();
        }, reps);
        let h = med(|| {
            bf16_gemm(isa, Matrix { data: &ah, offset: 0, rows: s(m, k as isize), cols: s(k, 1) },
                      Matrix { data: &bh, offset: 0, rows: s(k, n as isize), cols: s(n, 1) }, &mut c, threads, &|_, _| {}).unwrap();
        }, reps);
        println!("{m}x{k}x{n}: f32 {f:.3} ms, bf16 {h:.3} ms ({:.2}x)", h / f);
    }
}
