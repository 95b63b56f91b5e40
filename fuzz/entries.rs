//! What each fuzz target does with its input, in one place: the targets in fuzz_targets/ and
//! the stable regression test (train/tests/fuzz_corpus.rs) include this file, so the corpora
//! are replayed through exactly the code the fuzzer ran. Every function must return (an error
//! is fine) for any input: a panic, a hang or an unbounded allocation is a bug.

use std::path::Path;

/// The safetensors reader: header validation, then every tensor copied out.
pub fn safetensors(data: &[u8]) {
    if let Ok(file) = oxtrain_tensor::safetensors::load_bytes(data.to_vec(), "fuzz.safetensors") {
        for name in file.names() {
            let tensor = file.get(name).expect("a tensor the header validated must load");
            assert_eq!(tensor.dims(), file.info(name).expect("listed").shape.as_slice());
        }
    }
}

/// The TOML config with command-line overrides: the first line holds the overrides
/// (separated by spaces), the rest is the file.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (first, file) = text.split_once('\n').unwrap_or(("", text));
    let overrides: Vec<&str> = first.split(' ').filter(|s| !s.is_empty()).collect();
    if let Ok(config) = oxtrain::config::Config::from_toml_str(file, "fuzz.toml", &overrides) {
        // What `oxtrain config --print` shows must load back to the same config.
        let again = oxtrain::config::Config::from_toml_str(&config.to_toml(), "printed.toml", &[] as &[&str])
            .expect("a printed config loads back");
        assert_eq!(again, config);
    }
}

/// A checkpoint part's manifest.json.
pub fn checkpoint_manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(m) = oxtrain::checkpoint::manifest::parse(text) {
        assert!(m.rank < m.world_size);
    }
}

/// An image file through the dataset path: decoding with limits, then the eval transform
/// (resize, center crop) into a sample slot. Small limits keep each run fast; the
/// limits' checks are the same code at any size.
pub fn image(data: &[u8]) {
    use oxtrain_datasets::{DecodeLimits, ImageTransform, PixelOutput, SampleRng};
    let mut transform = ImageTransform::imagenet_eval(40, 32);
    transform.pixels = PixelOutput::U8; // byte samples: no alignment to arrange
    let limits = DecodeLimits { max_width: 1024, max_height: 1024, max_pixels: 1 << 18 };
    let mut out = vec![0u8; 3 * 32 * 32];
    let mut rng = SampleRng::new(0, 0, 0);
    let _ = transform.load_into(data, Path::new("fuzz.img"), &limits, &mut rng, &mut out);
}

/// The TCP store's server, fed the bytes as one client's requests.
pub fn store_messages(data: &[u8]) {
    let _ = oxtrain_comm::bootstrap::serve_bytes(data);
}
