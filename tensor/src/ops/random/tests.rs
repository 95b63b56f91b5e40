use super::philox::philox4x32_10;
use crate::ops::random::{default_generator, manual_seed};
use crate::*;
use half::bf16;
use std::sync::Mutex;

/// Tests that seed or draw from the process-wide generator take this lock, so that they do
/// not interleave their draws.
static DEFAULT_GENERATOR: Mutex<()> = Mutex::new(());

#[test]
fn philox4x32_10_matches_the_random123_known_answers() {
    // From the Random123 distribution (D. E. Shaw Research), file tests/kat_vectors, the
    // three `philox4x32 10` lines: counter (4 words), key (2 words), expected output (4 words).
    let kat: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        ([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
        ([u32::MAX; 4], [u32::MAX; 2], [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
        (
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0],
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
        ),
    ];
    for (counter, key, expected) in kat {
        assert_eq!(philox4x32_10(counter, key), expected, "counter {counter:x?}, key {key:x?}");
    }
}

/// Block `b` of seed `seed`, as the module docs define the stream.
fn documented_block(seed: u64, b: u64) -> [u32; 4] {
    philox4x32_10([b as u32, (b >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32])
}

device_test! {
    fn draws_follow_the_documented_stream(dev: Device) {
        let seed = 0x0123_4567_89ab_cdef;
        let mut gen = Generator::new(seed);
        let a = Distribution::UNIT_UNIFORM.sample_with(&mut gen, [2, 5], DType::F32, dev).unwrap().to_vec::<f32>();
        for (i, &x) in a.iter().enumerate() {
            let word = documented_block(seed, (i / 4) as u64)[i % 4];
            assert_eq!(x, (word >> 8) as f32 / (1u32 << 24) as f32, "f32 element {i}");
        }
        assert_eq!(gen.state().offset, 3, "10 f32 values take 3 blocks");
        let b = Distribution::UNIT_UNIFORM.sample_with(&mut gen, [3], DType::F64, dev).unwrap().to_vec::<f64>();
        for (i, &x) in b.iter().enumerate() {
            let w = documented_block(seed, 3 + (i / 2) as u64);
            let bits = (w[2 * (i % 2) + 1] as u64) << 32 | w[2 * (i % 2)] as u64;
            assert_eq!(x, (bits >> 11) as f64 / (1u64 << 53) as f64, "f64 element {i}");
        }
        assert_eq!(gen.state().offset, 5);
        let z = Distribution::STANDARD_NORMAL.sample_with(&mut gen, [2], DType::F64, dev).unwrap().to_vec::<f64>();
        let w = documented_block(seed, 5);
        let to_unit = |lo: u32, hi: u32| (((hi as u64) << 32 | lo as u64) >> 11) as f64 / (1u64 << 53) as f64;
        let (u1, u2) = (1.0 - to_unit(w[0], w[1]), to_unit(w[2], w[3]));
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        assert!((z[0] - r * theta.cos()).abs() < 1e-12 && (z[1] - r * theta.sin()).abs() < 1e-12, "{z:?}");
    }
}

device_test! {
    fn parallel_chunks_give_the_sequential_stream(dev: Device) {
        // One draw of 100_000 (filled in parallel chunks) equals a draw of 20_000 (one thread)
        // followed by one of 80_000: each element depends only on its index in the stream.
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            let whole = Distribution::STANDARD_NORMAL.sample_with(&mut Generator::new(7), 100_000, dtype, dev).unwrap();
            let mut gen = Generator::new(7);
            let head = Distribution::STANDARD_NORMAL.sample_with(&mut gen, 20_000, dtype, dev).unwrap();
            let tail = Distribution::STANDARD_NORMAL.sample_with(&mut gen, 80_000, dtype, dev).unwrap();
            let mut joined = head.to_f64_vec();
            joined.extend(tail.to_f64_vec());
            assert_eq!(whole.to_f64_vec(), joined, "{dtype}");
        }
    }
}

/// Mean, variance and the fraction of samples satisfying `pred`.
fn stats(v: &[f64], pred: impl Fn(f64) -> bool) -> (f64, f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let frac = v.iter().filter(|&&x| pred(x)).count() as f64 / n;
    (mean, var, frac)
}

/// Asserts `x` is within five standard errors `se` of `expected`.
#[track_caller]
fn within_5_sigma(x: f64, expected: f64, se: f64, what: &str) {
    assert!((x - expected).abs() <= 5.0 * se, "{what}: {x}, expected {expected} +- {}", 5.0 * se);
}

const N: usize = 100_000;

device_test! {
    fn uniform_samples_have_the_right_moments(dev: Device) {
        let mut gen = Generator::new(1);
        for (dtype, bits) in [(DType::F32, 24), (DType::F64, 53), (DType::F16, 11), (DType::BF16, 8)] {
            let v = Distribution::UNIT_UNIFORM.sample_with(&mut gen, [N / 100, 100], dtype, dev).unwrap().to_f64_vec();
            assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)), "{dtype}: a sample outside [0, 1)");
            // Uniform on the grid k / 2^bits, k < 2^bits.
            let step = 2f64.powi(-bits);
            let (mean, var, below_quarter) = stats(&v, |x| x < 0.25);
            let exact_var = (1.0 - step * step) / 12.0;
            within_5_sigma(mean, (1.0 - step) / 2.0, (exact_var / N as f64).sqrt(), &format!("{dtype} mean"));
            within_5_sigma(var, exact_var, (1.0 / 180.0 / N as f64).sqrt(), &format!("{dtype} variance"));
            within_5_sigma(below_quarter, 0.25, (0.25 * 0.75 / N as f64).sqrt(), &format!("{dtype} P(x < 1/4)"));
        }
        let v = Distribution::Uniform { low: -2.0, high: 5.0 }.sample_with(&mut gen, N, DType::F32, dev).unwrap().to_f64_vec();
        assert!(v.iter().all(|&x| (-2.0..=5.0).contains(&x)));
        let (mean, var, _) = stats(&v, |_| true);
        within_5_sigma(mean, 1.5, (49.0 / 12.0 / N as f64).sqrt(), "uniform(-2, 5) mean");
        within_5_sigma(var, 49.0 / 12.0, 49.0 * (1.0 / 180.0 / N as f64).sqrt(), "uniform(-2, 5) variance");
    }
}

device_test! {
    fn normal_samples_have_the_right_moments(dev: Device) {
        let mut gen = Generator::new(2);
        let n = N as f64;
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let v = Distribution::STANDARD_NORMAL.sample_with(&mut gen, [N], dtype, dev).unwrap().to_f64_vec();
            assert!(v.iter().all(|x| x.is_finite()), "{dtype}");
            let (mean, var, in_one_sigma) = stats(&v, |x| x.abs() < 1.0);
            let kurtosis = v.iter().map(|x| (x - mean).powi(4)).sum::<f64>() / n / (var * var);
            within_5_sigma(mean, 0.0, (1.0 / n).sqrt(), &format!("{dtype} mean"));
            // bf16 rounding adds variance of about (2^-8)^2 / 12 * E[x^2]: far below the bound.
            within_5_sigma(var, 1.0, (2.0 / n).sqrt(), &format!("{dtype} variance"));
            within_5_sigma(kurtosis, 3.0, (24.0 / n).sqrt(), &format!("{dtype} kurtosis"));
            let p = 0.682_689_492_137_086; // erf(1 / sqrt 2)
            within_5_sigma(in_one_sigma, p, (p * (1.0 - p) / n).sqrt(), &format!("{dtype} P(|x| < 1)"));
        }
        let v = Distribution::Normal { mean: 3.0, std: 2.0 }.sample_with(&mut gen, [N], DType::F32, dev).unwrap().to_f64_vec();
        let (mean, var, _) = stats(&v, |_| true);
        within_5_sigma(mean, 3.0, 2.0 / n.sqrt(), "normal(3, 2) mean");
        within_5_sigma(var, 4.0, 4.0 * (2.0 / n).sqrt(), "normal(3, 2) variance");
    }
}

device_test! {
    fn bernoulli_frequencies_follow_the_probabilities(dev: Device) {
        let probs = [0.0, 0.1, 0.5, 0.9, 1.0];
        let reps = N / probs.len();
        // A (reps, 5) probability matrix stored transposed, so the input is not contiguous.
        let columns: Vec<f32> = probs.iter().flat_map(|&p| std::iter::repeat_n(p as f32, reps)).collect();
        let input = Tensor::from_vec(columns, [5, reps], dev).unwrap().t();
        assert!(!input.is_contiguous());
        let mut gen = Generator::new(3);
        for dtype in [DType::F32, DType::BF16] {
            let input = input.to_dtype(dtype);
            let out = input.bernoulli_with(&mut gen);
            assert_eq!((out.dims(), out.dtype()), (input.dims(), dtype));
            let v = out.to_f64_vec();
            assert!(v.iter().all(|&x| x == 0.0 || x == 1.0));
            for (c, &p) in probs.iter().enumerate() {
                let freq = (0..reps).map(|r| v[r * 5 + c]).sum::<f64>() / reps as f64;
                // The probability the input actually holds after rounding to its dtype.
                let p = match dtype {
                    DType::F32 => (p as f32) as f64,
                    _ => bf16::from_f32(p as f32).to_f64(),
                };
                within_5_sigma(freq, p, (p * (1.0 - p) / reps as f64).sqrt(), &format!("{dtype} p = {p}"));
            }
        }
        let mask = Tensor::bernoulli_scalar_with(&mut gen, [N], 0.3, DType::Bool, dev).unwrap();
        let freq = mask.to_vec::<bool>().iter().filter(|&&b| b).count() as f64 / N as f64;
        within_5_sigma(freq, 0.3, (0.21 / N as f64).sqrt(), "bernoulli_scalar(0.3)");
    }
}

device_test! {
    fn randint_is_uniform_over_its_range(dev: Device) {
        let mut gen = Generator::new(4);
        let t = Tensor::randint_with(&mut gen, -3, 7, [N / 10, 10], dev).unwrap();
        assert_eq!((t.dims(), t.dtype()), (&[N / 10, 10][..], DType::I64));
        let mut counts = [0usize; 10];
        for x in t.to_vec::<i64>() {
            assert!((-3..7).contains(&x), "{x} outside -3..7");
            counts[(x + 3) as usize] += 1;
        }
        let se = (0.1 * 0.9 / N as f64).sqrt();
        for (k, &c) in counts.iter().enumerate() {
            within_5_sigma(c as f64 / N as f64, 0.1, se, &format!("P(x = {})", k as i64 - 3));
        }
        // The widest range works without overflow and reaches both signs.
        let wide = Tensor::randint_with(&mut gen, i64::MIN, i64::MAX, 1000, dev).unwrap().to_vec::<i64>();
        assert!(wide.iter().any(|&x| x < 0) && wide.iter().any(|&x| x > 0));
        assert!(wide.iter().all(|&x| x != i64::MAX));
    }
}

device_test! {
    fn randperm_is_a_permutation(dev: Device) {
        let mut gen = Generator::new(5);
        for n in [0, 1, 2, 1000, 100_000] {
            let p = Tensor::randperm_with(&mut gen, n, dev).unwrap();
            assert_eq!((p.dims(), p.dtype()), (&[n][..], DType::I64));
            let v = p.to_vec::<i64>();
            let mut sorted = v.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n as i64).collect::<Vec<_>>(), "randperm({n})");
            if n >= 1000 {
                let fixed_points = v.iter().enumerate().filter(|&(i, &x)| i as i64 == x).count();
                assert!(fixed_points < 10, "randperm({n}) has {fixed_points} fixed points");
            }
        }
        // Position of element 0 over many small permutations is uniform.
        let mut first = [0usize; 4];
        for _ in 0..4000 {
            first[Tensor::randperm_with(&mut gen, 4, dev).unwrap().to_vec::<i64>()[0] as usize] += 1;
        }
        for &c in &first {
            within_5_sigma(c as f64 / 4000.0, 0.25, (0.1875f64 / 4000.0).sqrt(), "P(perm[0] = k)");
        }
    }
}

device_test! {
    fn same_seed_same_tensor_and_state_restores(dev: Device) {
        let a = Distribution::STANDARD_NORMAL.sample_with(&mut Generator::new(42), [3, 4], DType::F32, dev).unwrap();
        let b = Distribution::STANDARD_NORMAL.sample_with(&mut Generator::new(42), [3, 4], DType::F32, dev).unwrap();
        let c = Distribution::STANDARD_NORMAL.sample_with(&mut Generator::new(43), [3, 4], DType::F32, dev).unwrap();
        assert_eq!(a.to_vec::<f32>(), b.to_vec::<f32>());
        assert_ne!(a.to_vec::<f32>(), c.to_vec::<f32>());

        let mut gen = Generator::new(9);
        Distribution::UNIT_UNIFORM.sample_with(&mut gen, 17, DType::F32, dev).unwrap();
        let saved = gen.state();
        let draw = |g: &mut Generator| {
            (
                Distribution::UNIT_UNIFORM.sample_with(g, [5], DType::F64, dev).unwrap().to_vec::<f64>(),
                Tensor::randint_with(g, 0, 100, [6], dev).unwrap().to_vec::<i64>(),
                Tensor::randperm_with(g, 8, dev).unwrap().to_vec::<i64>(),
            )
        };
        let first = draw(&mut gen);
        let second = draw(&mut gen);
        assert_ne!(first, second, "consecutive draws differ");
        // Restore from the state, from its bytes, and from JSON: all continue identically.
        let mut restored = Generator::new(0);
        restored.set_state(saved);
        assert_eq!((draw(&mut restored), draw(&mut restored)), (first.clone(), second.clone()));
        restored.set_state(GeneratorState::from_bytes(&saved.to_bytes()).unwrap());
        assert_eq!(draw(&mut restored), first);
        let json = serde_json::to_string(&saved).unwrap();
        restored.set_state(serde_json::from_str(&json).unwrap());
        assert_eq!(draw(&mut restored), first);
        assert!(GeneratorState::from_bytes(&[0; 15]).unwrap_err().to_string().contains("16 bytes"));
    }
}

device_test! {
    fn manual_seed_makes_the_default_generator_repeat(dev: Device) {
        let _lock = DEFAULT_GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
        manual_seed(1234);
        let a = Tensor::rand([4, 4], DType::F32, dev).unwrap();
        let b = Tensor::randn([4], DType::F64, dev).unwrap();
        assert_eq!(default_generator().state(), GeneratorState { seed: 1234, offset: 4 + 2 });
        manual_seed(1234);
        assert_eq!(Tensor::rand([4, 4], DType::F32, dev).unwrap().to_vec::<f32>(), a.to_vec::<f32>());
        assert_eq!(Tensor::randn([4], DType::F64, dev).unwrap().to_vec::<f64>(), b.to_vec::<f64>());
        manual_seed(1234);
        let mine = Distribution::UNIT_UNIFORM.sample_with(&mut Generator::new(1234), [4, 4], DType::F32, dev).unwrap();
        assert_eq!(a.rand_like().dims(), a.dims());
        assert_eq!(mine.to_vec::<f32>(), a.to_vec::<f32>());
    }
}

device_test! {
    #[should_panic(expected = "expected a floating-point dtype, got int64")]
    fn rand_of_an_integer_dtype_panics(dev: Device) {
        let _ = Distribution::UNIT_UNIFORM.sample_with(&mut Generator::new(0), [2], DType::I64, dev);
    }
}

device_test! {
    #[should_panic(expected = "bernoulli: probabilities must be in [0, 1], got 1.5 at element 1")]
    fn bernoulli_of_a_bad_probability_panics(dev: Device) {
        Tensor::from_vec(vec![0.5f32, 1.5], [2], dev).unwrap().bernoulli_with(&mut Generator::new(0));
    }
}

device_test! {
    #[should_panic(expected = "randint: expected low < high")]
    fn randint_of_an_empty_range_panics(dev: Device) {
        let _ = Tensor::randint_with(&mut Generator::new(0), 3, 3, [2], dev);
    }
}

#[test]
fn drawing_on_a_missing_device_is_an_error_and_consumes_nothing() {
    let mut gen = Generator::new(0);
    assert!(matches!(
        Distribution::STANDARD_NORMAL.sample_with(&mut gen, [2], DType::F32, Device::Cuda(64)),
        Err(Error::CudaUnavailable { .. })
    ));
    assert_eq!(gen.state().offset, 0);
}

/// Little-endian element bytes of a tensor, copied to the host.
fn host_bytes(t: &Tensor) -> Vec<u8> {
    let t = t.to_device(Device::Cpu).unwrap().contiguous();
    let s = t.storage();
    match &*s {
        crate::storage::Storage::Cpu(s) => s.as_bytes().to_vec(),
        crate::storage::Storage::Cuda(_) => unreachable!("copied to the host"),
    }
}

/// Draws `draw` on the CPU and on the GPU from generators in the same state; checks that both
/// leave the generator at the same offset and returns both results.
fn both(seed: u64, draw: impl Fn(&mut Generator, Device) -> Tensor) -> (Tensor, Tensor) {
    let (mut cpu_gen, mut gpu_gen) = (Generator::new(seed), Generator::new(seed));
    // A draw first so the stream does not start at block 0.
    let _ = Distribution::UNIT_UNIFORM.sample_with(&mut cpu_gen, [3], DType::F32, Device::Cpu).unwrap();
    let _ = Distribution::UNIT_UNIFORM.sample_with(&mut gpu_gen, [3], DType::F32, Device::Cuda(0)).unwrap();
    let c = draw(&mut cpu_gen, Device::Cpu);
    let g = draw(&mut gpu_gen, Device::Cuda(0));
    assert_eq!(cpu_gen.state(), gpu_gen.state(), "the generator advances as on the CPU");
    assert_eq!((g.dims(), g.dtype(), g.device()), (c.dims(), c.dtype(), Device::Cuda(0)));
    (c, g)
}

const SIZES: [usize; 6] = [0, 1, 5, 7, 1023, 100_003];

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_uniform_bernoulli_and_randint_equal_the_cpu_bit_for_bit() {
    for n in SIZES {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let (c, g) =
                both(7, |gen, dev| Distribution::UNIT_UNIFORM.sample_with(gen, [n], dtype, dev).unwrap());
            assert_eq!(host_bytes(&c), host_bytes(&g), "rand {n} {dtype}");
            let (c, g) = both(8, |gen, dev| {
                Distribution::Uniform { low: -2.5, high: 3.1 }.sample_with(gen, [n], dtype, dev).unwrap()
            });
            assert_eq!(host_bytes(&c), host_bytes(&g), "uniform {n} {dtype}");
        }
        for dtype in DType::ALL {
            let (c, g) =
                both(9, |gen, dev| Tensor::bernoulli_scalar_with(gen, [n], 0.3, dtype, dev).unwrap());
            assert_eq!(host_bytes(&c), host_bytes(&g), "bernoulli_scalar {n} {dtype}");
        }
        for (low, high) in [(0, 10), (-5, 1 << 40), (i64::MIN, i64::MAX), (3, 4)] {
            let (c, g) = both(10, |gen, dev| Tensor::randint_with(gen, low, high, [n], dev).unwrap());
            assert_eq!(c.to_vec::<i64>(), g.to_vec::<i64>(), "randint {n} in {low}..{high}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_bernoulli_of_a_strided_probability_tensor_equals_the_cpu() {
    let mut gen = Generator::new(11);
    let p = Distribution::UNIT_UNIFORM.sample_with(&mut gen, [37, 29], DType::F32, Device::Cpu).unwrap();
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        // Transposed and narrowed on the device: element i of the view is read through its strides.
        let (c, g) = both(12, |gen, dev| {
            let probs = p.to_dtype(dtype).to_device(dev).unwrap().t().narrow(0, 3, 20);
            assert!(!probs.is_contiguous());
            probs.bernoulli_with(gen)
        });
        assert_eq!(host_bytes(&c), host_bytes(&g), "bernoulli {dtype}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_normals_equal_the_cpu_to_about_an_ulp() {
    for n in SIZES {
        for (dtype, rtol, atol) in [
            (DType::F32, 2e-6, 1e-6),
            (DType::F64, 1e-14, 1e-14),
            (DType::F16, 1e-3, 1e-3),
            (DType::BF16, 8e-3, 8e-3),
        ] {
            let (c, g) =
                both(13, |gen, dev| Distribution::STANDARD_NORMAL.sample_with(gen, [n], dtype, dev).unwrap());
            crate::testing::assert_close(&g, &c, rtol, atol, &format!("randn {n} {dtype}"));
            let (c, g) = both(14, |gen, dev| {
                Distribution::Normal { mean: 3.0, std: 0.5 }.sample_with(gen, [n], dtype, dev).unwrap()
            });
            crate::testing::assert_close(&g, &c, rtol * 4.0, atol * 4.0, &format!("normal {n} {dtype}"));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_draws_resume_from_a_saved_state() {
    let gpu = Device::Cuda(0);
    let mut gen = Generator::new(99);
    let _ = Distribution::STANDARD_NORMAL.sample_with(&mut gen, [10], DType::F32, gpu).unwrap();
    let saved = GeneratorState::from_bytes(&gen.state().to_bytes()).unwrap();
    let a = Distribution::UNIT_UNIFORM.sample_with(&mut gen, [4, 33], DType::F32, gpu).unwrap();
    let b = Tensor::randint_with(&mut gen, 0, 1000, [17], gpu).unwrap();
    let mut restored = Generator::new(0);
    restored.set_state(saved);
    let a2 = Distribution::UNIT_UNIFORM.sample_with(&mut restored, [4, 33], DType::F32, gpu).unwrap();
    let b2 = Tensor::randint_with(&mut restored, 0, 1000, [17], gpu).unwrap();
    assert_eq!(host_bytes(&a), host_bytes(&a2));
    assert_eq!(b.to_vec::<i64>(), b2.to_vec::<i64>());
    assert_eq!(gen.state(), restored.state());
    // The default generator too, and a CPU draw from the same state gives the same numbers.
    let _guard = DEFAULT_GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(5);
    let g = Tensor::rand([100], DType::F32, gpu).unwrap();
    manual_seed(5);
    let c = Tensor::rand([100], DType::F32, Device::Cpu).unwrap();
    assert_eq!(host_bytes(&g), host_bytes(&c));
    assert_eq!(default_generator().state().offset, 25);
}
