//! torchvision's `ImageFolder`: `root/<class>/**/<file>` with classes in sorted order and files
//! in `make_dataset`'s order, plus the ImageNet layout (`root/train`, `root/val`).

use crate::dataset::{Dataset, Sample};
use crate::decode::{read_file, DecodeLimits};
use crate::error::{Error, Result};
use crate::gpu_decode::{GpuDecoding, PlannedFile};
use crate::rng::SampleRng;
use crate::transforms::{ChannelLayout, ImageTransform, PixelOutput};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[cfg(test)]
mod tests;

/// The image files a folder lists, matched case-insensitively at the end of the file name:
/// torchvision's `IMG_EXTENSIONS` less TIFF and WebP, which the decoder is built without (a
/// listed file that cannot decode would be a bad file in every epoch).
pub const IMG_EXTENSIONS: [&str; 6] = [".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm"];

/// Whether `name` ends with one of `extensions`, ignoring case (`has_file_allowed_extension`).
pub fn has_allowed_extension(name: &str, extensions: &[&str]) -> bool {
    let lower = name.to_lowercase();
    extensions.iter().any(|e| lower.ends_with(e))
}

/// The class folders of `dir`, sorted, and their indices (`find_classes`).
pub fn find_classes(dir: &Path) -> Result<(Vec<String>, BTreeMap<String, usize>)> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut classes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        // `entry.is_dir()` in Python follows symlinks, as `metadata` does.
        let is_dir = std::fs::metadata(entry.path()).map(|m| m.is_dir()).unwrap_or(false);
        if is_dir {
            classes.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    classes.sort();
    if classes.is_empty() {
        return Err(Error::Layout {
            path: dir.into(),
            reason: "no class folders found (expected root/<class>/<image>)".into(),
        });
    }
    let index = classes.iter().enumerate().map(|(i, c)| (c.clone(), i)).collect();
    Ok((classes, index))
}

/// Every directory under `dir` (itself included), following symlinks, with its file names.
fn walk(dir: &Path, out: &mut Vec<(String, Vec<String>)>, depth: usize) -> Result<()> {
    if depth > 64 {
        return Err(Error::Layout {
            path: dir.into(),
            reason: "folders nested over 64 deep (a symlink loop?)".into(),
        });
    }
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => dirs.push(path),
            Ok(_) => files.push(entry.file_name().to_string_lossy().into_owned()),
            Err(_) => {} // a dangling symlink: os.walk lists it as a file, is_valid_file drops it
        }
    }
    out.push((dir.to_string_lossy().into_owned(), files));
    for d in dirs {
        walk(&d, out, depth + 1)?;
    }
    Ok(())
}

/// `(path, class index)` of every image, in torchvision's `make_dataset` order: classes sorted,
/// within a class `sorted(os.walk(...))` by folder path, then file names sorted.
pub fn make_dataset(
    dir: &Path,
    class_to_idx: &BTreeMap<String, usize>,
    extensions: &[&str],
) -> Result<Vec<(PathBuf, usize)>> {
    let mut samples = Vec::new();
    let mut empty = Vec::new();
    for (class, &idx) in class_to_idx {
        let mut dirs = Vec::new();
        walk(&dir.join(class), &mut dirs, 0)?;
        dirs.sort();
        let before = samples.len();
        for (root, mut files) in dirs {
            files.sort();
            for f in files {
                if has_allowed_extension(&f, extensions) {
                    samples.push((Path::new(&root).join(f), idx));
                }
            }
        }
        if samples.len() == before {
            empty.push(class.clone());
        }
    }
    if !empty.is_empty() {
        return Err(Error::Layout {
            path: dir.into(),
            reason: format!(
                "no valid file for the classes {}; supported extensions are {}",
                empty.join(", "),
                extensions.join(", ")
            ),
        });
    }
    Ok(samples)
}

/// Images in class folders, each loaded through an [`ImageTransform`].
#[derive(Clone, Debug)]
pub struct ImageFolder {
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub class_to_idx: BTreeMap<String, usize>,
    pub samples: Vec<(PathBuf, usize)>,
    pub transform: ImageTransform,
    pub limits: DecodeLimits,
    /// Decoded on a GPU (set by [`ImageFolder::decode_on_gpu`]); None: on the loader's cores.
    pub gpu: Option<GpuDecoding>,
}

impl ImageFolder {
    /// The image folder at `root` (`root/<class>/...`).
    pub fn new(root: impl AsRef<Path>, transform: ImageTransform) -> Result<ImageFolder> {
        let root = root.as_ref().to_path_buf();
        let (classes, class_to_idx) = find_classes(&root)?;
        let samples = make_dataset(&root, &class_to_idx, &IMG_EXTENSIONS)?;
        Ok(ImageFolder {
            root,
            classes,
            class_to_idx,
            samples,
            transform,
            limits: DecodeLimits::default(),
            gpu: None,
        })
    }

    /// One split of an ImageNet-layout folder: `root/<split>/<class>/...` (`split` is "train"
    /// or "val").
    pub fn imagenet(root: impl AsRef<Path>, split: &str, transform: ImageTransform) -> Result<ImageFolder> {
        ImageFolder::new(root.as_ref().join(split), transform)
    }

    pub fn with_limits(mut self, limits: DecodeLimits) -> Self {
        self.limits = limits;
        if let Some(gpu) = &mut self.gpu {
            gpu.limits = limits;
        }
        self
    }

    /// Decodes this folder's JPEGs on GPU `ordinal` with nvJPEG ([`crate::gpu_decode`]): the
    /// loader's workers read the files and draw each crop, the GPU decodes, crops and resizes;
    /// files it refuses go to the CPU decoder and are counted ([`ImageFolder::gpu_fallbacks`]).
    /// The transform must leave the pixels to the device
    /// ([`ImageTransform::for_device_normalize`]).
    pub fn decode_on_gpu(mut self, ordinal: usize) -> Result<Self> {
        let t = &self.transform;
        if !(t.pixels == PixelOutput::U8 && t.layout == ChannelLayout::Hwc && t.flip_on_device) {
            return Err(Error::Config(
                "decoding on the GPU needs a transform that leaves the pixels to the device \
                 (ImageTransform::for_device_normalize)"
                    .into(),
            ));
        }
        crate::gpu_decode::nvjpeg::available().map_err(Error::GpuDecoder)?;
        self.gpu = Some(GpuDecoding { ordinal, limits: self.limits, fallbacks: Default::default() });
        Ok(self)
    }

    /// Files the GPU decoder refused and the CPU decoded instead, so far (0 on the CPU path).
    pub fn gpu_fallbacks(&self) -> usize {
        self.gpu.as_ref().map_or(0, |g| g.fallbacks.get())
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

impl Dataset for ImageFolder {
    fn len(&self) -> usize {
        self.samples.len()
    }

    fn sample(&self) -> Sample {
        let dtype = match self.transform.pixels {
            crate::transforms::PixelOutput::U8 => oxtrain_tensor::DType::U8,
            crate::transforms::PixelOutput::F32 { .. } => oxtrain_tensor::DType::F32,
        };
        Sample { shape: self.transform.sample_shape(), dtype }
    }

    fn load_into(&self, index: usize, rng: &mut SampleRng, out: &mut [u8]) -> Result<i64> {
        self.load_with_flip(index, rng, out).map(|(label, _)| label)
    }

    fn load_with_flip(&self, index: usize, rng: &mut SampleRng, out: &mut [u8]) -> Result<(i64, bool)> {
        let (path, class) = &self.samples[index];
        let bytes = read_file(path)?;
        let flip = self.transform.load_into(&bytes, path, &self.limits, rng, out)?;
        Ok((*class as i64, flip))
    }

    fn gpu_decoding(&self) -> Option<&GpuDecoding> {
        self.gpu.as_ref()
    }

    fn plan_sample(&self, index: usize, rng: &mut SampleRng) -> Result<(PlannedFile, i64)> {
        let (path, class) = &self.samples[index];
        let bytes = read_file(path)?;
        let file = PlannedFile::plan_with(&self.transform, &self.limits, index, rng, path, bytes)?;
        Ok((file, *class as i64))
    }
}
