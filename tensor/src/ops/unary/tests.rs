//! Tests of this op family (fixtures from the script beside them).
