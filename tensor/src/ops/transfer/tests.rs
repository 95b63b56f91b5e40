//! Pinned uploads: the staging-size rule runs everywhere; the uploads need a GPU.

use crate::cuda::{self, PinnedBuffer};
use crate::{DType, Device, Tensor};

#[test]
fn staging_buffers_round_up_to_a_power_of_two_of_at_least_a_mebibyte() {
    use crate::cuda::pinned::staging_size;
    assert_eq!(staging_size(0), 1 << 20);
    assert_eq!(staging_size(1000), 1 << 20);
    assert_eq!(staging_size((1 << 20) + 1), 2 << 20);
    assert_eq!(staging_size(3 << 20), 4 << 20);
    assert_eq!(staging_size(4 << 20), 4 << 20);
}

#[test]
#[should_panic(expected = "record_stream: expected a CUDA tensor, got one on cpu")]
#[ignore = "needs a CUDA GPU"]
fn record_stream_of_a_cpu_tensor_panics() {
    let s = cuda::Stream::new(0).unwrap();
    Tensor::zeros([2], DType::F32, Device::Cpu).unwrap().record_stream(&s);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn non_blocking_uploads_equal_blocking_ones() {
    let gpu = Device::Cuda(0);
    let x = Tensor::arange(0.0, 3000.0, 1.0, DType::F32, Device::Cpu).unwrap().reshape([30, 100]);
    // Contiguous, a narrowed view (nonzero offset), a transposed view, and other dtypes.
    let views = [
        x.clone(),
        x.narrow(0, 7, 5),
        x.t(),
        x.to_dtype(DType::BF16),
        x.to_dtype(DType::I64).narrow(1, 3, 4),
        x.narrow(0, 0, 2).to_dtype(DType::Bool),
        Tensor::zeros([0, 3], DType::F64, Device::Cpu).unwrap(),
    ];
    for v in views {
        let fast = v.to_device_non_blocking(gpu).unwrap();
        assert_eq!((fast.device(), fast.dims(), fast.dtype()), (gpu, v.dims(), v.dtype()));
        assert_eq!(fast.to_f64_vec(), v.to_f64_vec(), "{v:?}");
    }
    // Many uploads in a row: staging buffers are reused only after their copies finished.
    let uploads: Vec<Tensor> = (0..50)
        .map(|i| {
            Tensor::full([1 << 18], i as f64, DType::F32, Device::Cpu)
                .unwrap()
                .to_device_non_blocking(gpu)
                .unwrap()
        })
        .collect();
    for (i, u) in uploads.iter().enumerate() {
        assert!(u.to_vec::<f32>().iter().all(|&x| x == i as f32), "upload {i}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn from_pinned_uploads_and_the_buffer_can_be_refilled() {
    let gpu = Device::Cuda(0);
    let mut buf = PinnedBuffer::new(0, 4096 * 4).unwrap();
    let mut batches = Vec::new();
    for step in 0..4 {
        // `as_mut_slice` waits for the previous upload before the loader overwrites the data.
        for (i, x) in buf.as_mut_slice::<f32>().iter_mut().enumerate() {
            *x = (step * 10_000 + i) as f32;
        }
        batches.push(Tensor::from_pinned(&mut buf, [64, 64], DType::F32, gpu).unwrap());
    }
    for (step, b) in batches.iter().enumerate() {
        let expected: Vec<f32> = (0..4096).map(|i| (step * 10_000 + i) as f32).collect();
        assert_eq!(b.to_vec::<f32>(), expected, "batch {step}");
    }
    buf.as_mut_slice::<u8>()[..6].copy_from_slice(&[1, 0, 1, 1, 0, 0]);
    let flags = Tensor::from_pinned(&mut buf, [2, 3], DType::Bool, gpu).unwrap();
    assert_eq!(flags.to_vec::<bool>(), vec![true, false, true, true, false, false]);
    let on_cpu = Tensor::from_pinned(&mut buf, [6], DType::U8, Device::Cpu).unwrap();
    assert_eq!(on_cpu.to_vec::<u8>(), vec![1, 0, 1, 1, 0, 0]);
    buf.wait().unwrap();
    assert!(!buf.is_busy());
}

#[test]
#[ignore = "needs a CUDA GPU"]
#[should_panic(expected = "from_pinned: shape [10] of float32 needs 40 bytes, the pinned buffer holds 16")]
fn from_pinned_past_the_buffer_panics() {
    let mut buf = PinnedBuffer::new(0, 16).unwrap();
    let _ = Tensor::from_pinned(&mut buf, [10], DType::F32, Device::Cuda(0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_tensor_used_on_another_stream_is_not_reused_early() {
    let gpu = Device::Cuda(0);
    let side = cuda::Stream::new(0).unwrap();
    {
        let x = Tensor::ones([1 << 20], DType::F32, gpu).unwrap();
        side.wait_stream(&cuda::Stream::current(0).unwrap()).unwrap();
        {
            let _on_side = side.make_current();
            let y = x.mul_scalar(2.0);
            x.record_stream(&side);
            y.record_stream(&side);
        }
        // Dropped here; the blocks wait for the side stream before they are handed out again.
    }
    side.synchronize().unwrap();
    let z = Tensor::zeros([1 << 20], DType::F32, gpu).unwrap();
    assert_eq!(z.to_vec::<f32>().iter().filter(|&&v| v != 0.0).count(), 0);
}
