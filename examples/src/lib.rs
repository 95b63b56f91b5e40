//! Example programs live beside this crate as `[[example]]` targets.
