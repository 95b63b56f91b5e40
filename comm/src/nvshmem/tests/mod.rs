//! Tests of the nvshmem backend that need no GPU.

mod hier_plans;
