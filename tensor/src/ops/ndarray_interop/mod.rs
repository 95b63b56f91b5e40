//! Conversion to and from [`ndarray`] arrays: any element type, any dimensionality, any
//! memory layout on either side (transposed, sliced, negative-stride arrays; strided views).

#[cfg(test)]
mod tests;

use crate::{Device, Element, Result, Tensor};
use ndarray::{Array, ArrayBase, ArrayD, Data, Dimension, IxDyn};

impl Tensor {
    /// A tensor with the array's shape and elements (row-major), on `device`.
    ///
    /// Takes owned arrays, views (`a.view()`) and shared arrays alike. An owned array already in
    /// standard (row-major) layout hands its buffer over without a copy; any other layout is
    /// copied into row-major order.
    pub fn from_ndarray<T, S, D>(array: ArrayBase<S, D>, device: Device) -> Result<Tensor>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        let shape = array.shape().to_vec();
        let n = array.len();
        let owned: Array<T, D> = if array.is_standard_layout() {
            array.into_owned()
        } else {
            array.as_standard_layout().into_owned()
        };
        let (mut data, offset) = owned.into_raw_vec_and_offset();
        // An owned array may sit inside a larger buffer (after `slice_collapse`, say).
        let start = offset.unwrap_or(0);
        if start != 0 || data.len() != n {
            data = data[start..start + n].to_vec();
        }
        Tensor::from_vec(data, shape, device)
    }

    /// The elements as a row-major `ArrayD` of the tensor's shape (copied, strided views
    /// included). Panics unless `T` is the tensor's element type; convert with `.to_dtype()`
    /// first. `.into_dimensionality::<Ix2>()` gives a fixed-rank array.
    pub fn to_ndarray<T: Element>(&self) -> ArrayD<T> {
        assert!(
            T::DTYPE == self.dtype(),
            "to_ndarray::<{:?}>: the tensor has dtype {} and shape {:?}; convert it with .to_dtype() first",
            T::DTYPE,
            self.dtype(),
            self.dims()
        );
        ArrayD::from_shape_vec(IxDyn(self.dims()), self.to_vec::<T>())
            .expect("to_vec gives shape-many elements")
    }
}
