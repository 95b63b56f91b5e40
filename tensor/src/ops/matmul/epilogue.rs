//! cuBLASLt epilogues: work that cuBLASLt does on a product's result inside the product's own
//! kernel (a bias, GELU and its gradient, a bias gradient), instead of a separate pass over
//! the result. `fused.rs` holds the tensor ops built on them; this file describes an epilogue
//! to cuBLASLt.
//!
//! Everything here speaks of cuBLASLt's column-major problem `D [m, n] = A [m, k] @ B [k, n]`,
//! which `cuda::gemm` makes of our row-major one by swapping the operands: cuBLAS's A is our
//! rhs, its B our lhs, and its rows (`m`) are the columns of our output. So a bias "per row of
//! D" is our per-column bias, the "GELU input matrix" with leading dimension `aux_ld` is a
//! row-major matrix shaped like our output with row stride `aux_ld`, and BGRADA sums our rhs
//! over its rows.

use cudarc::cublaslt::{result as lt, sys};
use std::ffi::c_void;

/// Which epilogue, in cuBLASLt's terms (see the module comment for ours).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum EpilogueKind {
    /// `D = A B + bias` with `bias[i]` added to row `i`.
    Bias,
    /// `aux = A B + bias`, `D = gelu_tanh(aux)`.
    GeluAuxBias,
    /// `D = (A B) * gelu_tanh'(aux)`.
    DGelu,
    /// As `DGelu`, and `bias[i]` = the sum of row `i` of `D`.
    DGeluBGrad,
    /// `D = A B`, and `bias[i]` = the sum of row `i` of `A` (over k).
    BGradA,
    /// `D = A B`, and `bias[j]` = the sum of column `j` of `B` (over k).
    BGradB,
}

impl EpilogueKind {
    fn raw(self) -> sys::cublasLtEpilogue_t {
        use sys::cublasLtEpilogue_t::*;
        match self {
            EpilogueKind::Bias => CUBLASLT_EPILOGUE_BIAS,
            EpilogueKind::GeluAuxBias => CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            EpilogueKind::DGelu => CUBLASLT_EPILOGUE_DGELU,
            EpilogueKind::DGeluBGrad => CUBLASLT_EPILOGUE_DGELU_BGRAD,
            EpilogueKind::BGradA => CUBLASLT_EPILOGUE_BGRADA,
            EpilogueKind::BGradB => CUBLASLT_EPILOGUE_BGRADB,
        }
    }

    /// Whether the epilogue reads or writes the bias vector.
    pub fn has_bias(self) -> bool {
        !matches!(self, EpilogueKind::DGelu)
    }

    /// Whether the epilogue reads or writes the GELU input matrix.
    pub fn has_aux(self) -> bool {
        matches!(self, EpilogueKind::GeluAuxBias | EpilogueKind::DGelu | EpilogueKind::DGeluBGrad)
    }
}

/// An epilogue with its buffers: device addresses, in the output's dtype (cuBLASLt's default
/// for both the bias and the GELU input when D is f32, f16 or bf16).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Epilogue {
    pub kind: EpilogueKind,
    /// The bias (read) or the bias gradient (written): packed, unit stride.
    pub bias: u64,
    /// The GELU input matrix (written by `GeluAuxBias`, read by the gradients).
    pub aux: u64,
    /// Its leading dimension in elements: a multiple of 8, at least D's rows (cuBLASLt's rule).
    pub aux_ld: usize,
}

/// What an algorithm chosen for an epilogue depends on beyond the problem's shape: cuBLASLt's
/// heuristic reads the bias and aux addresses to learn their alignment, and is told the
/// alignment of A, B and C, so a choice holds only for buffers aligned at least as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EpilogueKey {
    kind: EpilogueKind,
    aux_ld: usize,
    alignment: u32,
}

/// The largest power of two up to 256 that divides `ptr` (256 for a null pointer).
pub(crate) fn alignment(ptr: u64) -> u32 {
    1 << ptr.trailing_zeros().min(8)
}

impl Epilogue {
    /// The smallest alignment among cuBLAS's A, B and C and the epilogue's buffers.
    fn alignment(&self, (a, b, c): (u64, u64, u64)) -> u32 {
        let extra = [self.kind.has_bias().then_some(self.bias), self.kind.has_aux().then_some(self.aux)];
        [a, b, c].into_iter().chain(extra.into_iter().flatten()).map(alignment).min().unwrap_or(256)
    }

    /// The part of the algorithm cache's key that this epilogue adds (`ptrs`: cuBLAS's A, B, C).
    pub fn key(&self, ptrs: (u64, u64, u64)) -> EpilogueKey {
        EpilogueKey { kind: self.kind, aux_ld: self.aux_ld, alignment: self.alignment(ptrs) }
    }

    /// Sets the epilogue on `matmul` and the buffers' alignment on `pref` (`ptrs`: cuBLAS's A,
    /// B and C); false when cuBLASLt refuses an attribute.
    pub fn describe(
        &self,
        matmul: sys::cublasLtMatmulDesc_t,
        pref: sys::cublasLtMatmulPreference_t,
        ptrs: (u64, u64, u64),
    ) -> bool {
        use sys::cublasLtMatmulDescAttributes_t as D;
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let raw = self.kind.raw() as u32;
        let (bias, aux) = (self.bias as *const c_void, self.aux as *const c_void);
        let Ok(aux_ld) = i64::try_from(self.aux_ld) else { return false };
        let align = self.alignment(ptrs);
        let set = |attr: D, value: *const c_void, size: usize| {
            // SAFETY: a live descriptor; each value has the type and size cuBLASLt documents
            // for its attribute (u32 epilogue, pointers, i64 leading dimension).
            unsafe { lt::set_matmul_desc_attribute(matmul, attr, value, size) }.is_ok()
        };
        let pref_align = |attr: P| {
            // SAFETY: a live preference; the minimum alignments are u32 byte counts.
            unsafe { lt::set_matmul_pref_attribute(pref, attr, &align as *const u32 as *const c_void, 4) }
                .is_ok()
        };
        let ptr_size = std::mem::size_of::<*const c_void>();
        set(D::CUBLASLT_MATMUL_DESC_EPILOGUE, &raw as *const u32 as *const c_void, 4)
            && (!self.kind.has_bias()
                || set(
                    D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias as *const *const c_void as *const c_void,
                    ptr_size,
                ))
            && (!self.kind.has_aux()
                || (set(
                    D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                    &aux as *const *const c_void as *const c_void,
                    ptr_size,
                ) && set(
                    D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                    &aux_ld as *const i64 as *const c_void,
                    8,
                )))
            && pref_align(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES)
            && pref_align(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES)
            && pref_align(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES)
            && pref_align(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0), 256);
        assert_eq!(alignment(0x7000_0000), 256);
        assert_eq!(alignment(0x7000_0010), 16);
        assert_eq!(alignment(0x7000_0602), 2);
        assert_eq!(alignment(0x7000_0080), 128);
    }

    #[test]
    fn the_key_takes_the_worst_aligned_buffer_the_epilogue_uses() {
        let e = Epilogue { kind: EpilogueKind::Bias, bias: 0x1010, aux: 0x1002, aux_ld: 0 };
        // The aux address is not used by a bias epilogue.
        assert_eq!(e.key((0x2000, 0x3000, 0x4000)).alignment, 16);
        let e = Epilogue { kind: EpilogueKind::DGelu, bias: 0x1002, aux: 0x1040, aux_ld: 64 };
        assert_eq!(e.key((0x2000, 0x3000, 0x4000)).alignment, 64);
        assert_eq!(e.key((0x2000, 0x3008, 0x4000)).alignment, 8);
    }
}
