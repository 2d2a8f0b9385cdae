//! `pipetrain export --checkpoint PATH --hf DIR`: a Hugging Face GPT-2 or Llama directory.

use crate::checkpoint;
use crate::cli::ExportArgs;

pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let ck = checkpoint::load_checkpoint(&args.checkpoint)?;
    checkpoint::export_hf(&ck, &args.hf, args.force)?;
    println!(
        "exported {} -> {} (config.json, model.safetensors, manifest.sha256)",
        ck.dir.display(),
        args.hf.display()
    );
    Ok(())
}
