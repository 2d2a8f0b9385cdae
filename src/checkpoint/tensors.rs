//! Named f32 tensors and their safetensors files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Map};

use super::manifest::Hasher;
use crate::error::user_error;

/// One parameter (or optimizer moment) with its Hugging Face GPT-2 name and layout; the
/// same type crosses ranks when checkpoints are gathered and scattered.
pub use stages::NamedTensor;

/// Writes `tensors` to `path` as safetensors and syncs it to disk. Written here rather than
/// by `safetensors::serialize_to_file` so the tensors stream out without a second copy in
/// memory and the file gets the usual permissions (that function persists a 0600 temp file).
/// The `format: pt` metadata is what `transformers` requires before it loads a file.
/// Returns the file's sha256, taken from the bytes as they are written.
pub fn write_safetensors(path: &Path, tensors: &[NamedTensor]) -> anyhow::Result<String> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut offset = 0;
    for t in tensors {
        anyhow::ensure!(
            t.shape.iter().product::<usize>() == t.data.len(),
            "tensor {} has shape {:?} but {} values",
            t.name,
            t.shape,
            t.data.len()
        );
        let end = offset + 4 * t.data.len();
        let entry = json!({ "dtype": "F32", "shape": t.shape, "data_offsets": [offset, end] });
        anyhow::ensure!(header.insert(t.name.clone(), entry).is_none(), "tensor {} appears twice", t.name);
        offset = end;
    }
    let mut header = serde_json::to_vec(&header)?;
    // The format aligns the data to 8 bytes by padding the header with spaces.
    header.resize(header.len().next_multiple_of(8), b' ');

    let mut w = BufWriter::new(File::create(path)?);
    let mut hasher = Hasher::default();
    let mut write = |bytes: &[u8]| {
        hasher.update(bytes);
        w.write_all(bytes)
    };
    write(&(header.len() as u64).to_le_bytes())?;
    write(&header)?;
    let mut bytes = Vec::with_capacity(4 * CHUNK);
    for t in tensors {
        for chunk in t.data.chunks(CHUNK) {
            bytes.clear();
            bytes.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
            write(&bytes)?;
        }
    }
    w.into_inner()?.sync_all()?;
    Ok(hasher.hex())
}

/// Values converted to bytes (and hashed) at a time by [`write_safetensors`].
const CHUNK: usize = 1 << 14;

/// Reads every tensor of a safetensors file, in no particular order, as f32: pipetrain
/// writes f32, and Hugging Face checkpoints of the models users start from come in bf16 or
/// f16 too, which widen exactly.
pub fn read_safetensors(path: &Path) -> anyhow::Result<Vec<NamedTensor>> {
    let shown = path.display();
    let file = File::open(path).map_err(|e| user_error(format!("{shown}: cannot open: {e}")))?;
    // SAFETY: read-only map, dropped before returning; the data is copied out.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| user_error(format!("{shown}: cannot map: {e}")))?;
    let st = SafeTensors::deserialize(&map)
        .map_err(|e| user_error(format!("{shown}: not a valid safetensors file: {e}")))?;
    st.iter()
        .map(|(name, view)| {
            let bytes = view.data();
            let data = match view.dtype() {
                Dtype::F32 => {
                    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
                }
                Dtype::BF16 => {
                    bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
                }
                Dtype::F16 => {
                    bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
                }
                other => {
                    return Err(user_error(format!(
                        "{shown}: {name} has dtype {other:?}; pipetrain reads F32, BF16 and F16"
                    )))
                }
            };
            Ok(NamedTensor { name: name.to_string(), shape: view.shape().to_vec(), data })
        })
        .collect()
}

/// Errors, naming `file` and the tensor, where a value of `tensors` is NaN or infinite: a
/// run started from it would train on garbage.
pub fn check_finite(file: &Path, tensors: &[NamedTensor]) -> anyhow::Result<()> {
    for t in tensors {
        if let Some((i, v)) = t.data.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(user_error(format!(
                "{}: {} holds a non-finite value ({v} at element {i} of {})",
                file.display(),
                t.name,
                t.data.len()
            )));
        }
    }
    Ok(())
}

/// Brings a Hugging Face weight file to pipetrain's names: strips the `transformer.` prefix
/// that `GPT2LMHeadModel.save_pretrained` writes, drops the buffers some versions save (GPT-2's
/// attention masks `h.{i}.attn.bias` and `h.{i}.attn.masked_bias`, Llama's
/// `rotary_emb.inv_freq`), and where the model ties its output layer to `token_embedding`,
/// drops `lm_head.weight` after checking it is that tensor.
pub fn normalize_hf_names(
    path: &Path,
    tensors: Vec<NamedTensor>,
    tied_to: Option<&str>,
) -> anyhow::Result<Vec<NamedTensor>> {
    let mut kept = Vec::with_capacity(tensors.len());
    let mut lm_head = None;
    for mut t in tensors {
        if let Some(rest) = t.name.strip_prefix("transformer.") {
            t.name = rest.to_string();
        }
        if t.name == "lm_head.weight" && tied_to.is_some() {
            lm_head = Some(t);
        } else if !is_attention_mask_buffer(&t.name) && !t.name.ends_with(".rotary_emb.inv_freq") {
            kept.push(t);
        }
    }
    if let (Some(head), Some(embedding)) = (lm_head, tied_to) {
        let tied = kept.iter().any(|t| t.name == embedding && t.shape == head.shape && t.data == head.data);
        if !tied {
            return Err(user_error(format!(
                "{}: lm_head.weight differs from {embedding}; the config ties them \
                 (tie_word_embeddings)",
                path.display()
            )));
        }
    }
    Ok(kept)
}

fn is_attention_mask_buffer(name: &str) -> bool {
    let mut parts = name.split('.');
    matches!(
        (parts.next(), parts.next().map(|i| i.parse::<usize>()), parts.next(), parts.next(), parts.next()),
        (Some("h"), Some(Ok(_)), Some("attn"), Some("bias" | "masked_bias"), None)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_dir;

    fn t(name: &str, data: &[f32]) -> NamedTensor {
        NamedTensor { name: name.into(), shape: vec![data.len()], data: data.to_vec() }
    }

    #[test]
    fn round_trip_is_bitwise() {
        let dir = test_dir("st_round_trip");
        let p = dir.join("m.safetensors");
        let a = NamedTensor {
            name: "b".into(),
            shape: vec![2, 2],
            data: vec![1.5, -0.0, f32::MIN_POSITIVE, 3e-41],
        };
        let b = t("a", &[f32::MAX]);
        write_safetensors(&p, &[a.clone(), b.clone()]).unwrap();
        let mut back = read_safetensors(&p).unwrap();
        back.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(back, [b, a]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back[1].data), bits(&[1.5, -0.0, f32::MIN_POSITIVE, 3e-41]));
    }

    #[test]
    fn writes_the_metadata_transformers_requires() {
        let dir = test_dir("st_metadata");
        let p = dir.join("m.safetensors");
        write_safetensors(&p, &[t("a", &[1.0])]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(meta.metadata().as_ref().unwrap().get("format").map(String::as_str), Some("pt"));
    }

    #[test]
    fn refuses_inconsistent_tensors() {
        let p = test_dir("st_inconsistent").join("m.safetensors");
        let short = NamedTensor { name: "a".into(), shape: vec![2, 2], data: vec![1.0] };
        assert_eq!(
            write_safetensors(&p, &[short]).unwrap_err().to_string(),
            "tensor a has shape [2, 2] but 1 values"
        );
        let err = write_safetensors(&p, &[t("a", &[1.0]), t("a", &[2.0])]).unwrap_err();
        assert_eq!(err.to_string(), "tensor a appears twice");
    }

    #[test]
    fn garbage_is_a_user_error() {
        let dir = test_dir("st_garbage");
        let p = dir.join("m.safetensors");
        std::fs::write(&p, b"not safetensors at all").unwrap();
        let err = read_safetensors(&p).unwrap_err();
        assert!(crate::error::is_user_error(&err));
        assert!(err.to_string().starts_with(&format!("{}: not a valid safetensors file: ", p.display())));
    }

    #[test]
    fn hf_names_are_normalized() {
        let p = Path::new("hf/model.safetensors");
        let input = vec![
            t("transformer.wte.weight", &[1.0, 2.0]),
            t("transformer.h.0.attn.bias", &[1.0]),
            t("h.1.attn.masked_bias", &[1.0]),
            t("transformer.h.0.attn.c_attn.bias", &[3.0]),
            t("lm_head.weight", &[1.0, 2.0]),
        ];
        let names: Vec<String> =
            normalize_hf_names(p, input, Some("wte.weight")).unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["wte.weight", "h.0.attn.c_attn.bias"]);

        let untied = vec![t("wte.weight", &[1.0, 2.0]), t("lm_head.weight", &[1.0, 2.5])];
        assert_eq!(
            normalize_hf_names(p, untied, Some("wte.weight")).unwrap_err().to_string(),
            "hf/model.safetensors: lm_head.weight differs from wte.weight; the config ties them (tie_word_embeddings)"
        );
    }
}
