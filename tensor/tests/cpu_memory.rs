//! The CPU tensor byte count: exact here, where no other test allocates at the same time
//! (this binary holds one test).

use oxtrain_tensor::{cpu_memory_stats, reset_cpu_peak, DType, Device, Tensor};

#[test]
fn a_storage_is_counted_while_any_view_of_it_lives() {
    reset_cpu_peak();
    let start = cpu_memory_stats();
    let t = Tensor::zeros(1000, DType::F32, Device::Cpu).unwrap();
    let view = t.reshape([250, 4]);
    let alive = cpu_memory_stats();
    assert_eq!(alive.allocated, start.allocated + 4000);
    assert_eq!(alive.peak_allocated, alive.allocated);
    drop(t);
    assert_eq!(cpu_memory_stats().allocated, alive.allocated, "a view keeps the storage");
    let doubled = view.mul_scalar(2.0).to_dtype(DType::F64);
    // The f32 product was freed once its f64 cast was made; the peak saw both at once.
    assert_eq!(cpu_memory_stats().allocated, alive.allocated + 8000);
    assert_eq!(cpu_memory_stats().peak_allocated, alive.allocated + 4000 + 8000);
    drop((view, doubled));
    assert_eq!(cpu_memory_stats().allocated, start.allocated);
    reset_cpu_peak();
    assert_eq!(cpu_memory_stats().peak_allocated, start.allocated);
}
