//! The parameters of one model chunk, with Hugging Face GPT-2 names and layouts, their
//! gradients and AdamW moments.
//!
//! Every parameter has a global index in the whole model's order (wte, wpe, h.0.*, h.1.*,
//! ..., ln_f.*), which keys its initialisation and orders the global grad-norm sum, so both
//! are the same whatever the partition into stages.

use crate::init::normal_init;
use crate::shape::GptShape;
use crate::tensor_parallel::Split;
use kernels::{Category, Device, Tensor};
use std::ops::Range;

/// The part of the model a chunk holds: an optional embedding, a contiguous range of
/// transformer blocks, an optional head (final LayerNorm + tied LM head + loss).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkLayout {
    pub blocks: Range<usize>,
    pub embedding: bool,
    pub head: bool,
}

/// The twelve tensors of block `i`, in this order (offsets used by the layers).
pub const BLOCK_PARAM_NAMES: [&str; 12] = [
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
];
pub const LN1_W: usize = 0;
pub const LN1_B: usize = 1;
pub const ATTN_W: usize = 2;
pub const ATTN_B: usize = 3;
pub const ATTN_PROJ_W: usize = 4;
pub const ATTN_PROJ_B: usize = 5;
pub const LN2_W: usize = 6;
pub const LN2_B: usize = 7;
pub const FC_W: usize = 8;
pub const FC_B: usize = 9;
pub const FC_PROJ_W: usize = 10;
pub const FC_PROJ_B: usize = 11;

#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    Normal(f32),
    Zeros,
    Ones,
}

/// One parameter tensor's identity.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Hugging Face GPT-2 name, e.g. `h.3.mlp.c_fc.weight`.
    pub name: String,
    pub shape: Vec<usize>,
    /// Position in the whole model's parameter order.
    pub global_index: usize,
    pub init: Init,
    /// AdamW weight decay applies (matrices and embeddings, not biases or LayerNorm).
    pub decay: bool,
    /// How Megatron splits it over tensor-parallel ranks: the token embedding by vocabulary,
    /// column-parallel weights and biases by columns, row-parallel weights by rows (never by
    /// sequence: a parameter is `Interior` or `Replicated`).
    pub split: Split,
}

/// The full model's parameter list, in global order.
pub fn model_param_specs(s: &GptShape) -> Vec<ParamSpec> {
    chunk_param_specs(s, &ChunkLayout { blocks: 0..s.num_layers, embedding: true, head: true })
}

/// The specs of one chunk, in global order. A head-only chunk also holds a copy of
/// `wte.weight` (the tied LM head), listed first like the embedding's. Only the chunk's own
/// specs are built (the planner sizes thousands of chunks).
pub fn chunk_param_specs(s: &GptShape, layout: &ChunkLayout) -> Vec<ParamSpec> {
    let (c, f, std) = (s.hidden, s.ffn, 0.02f32);
    // GPT-2 scales the residual projections by 1/sqrt(2 * layers).
    let proj_std = std / (2.0 * s.num_layers as f32).sqrt();
    let wte = ParamSpec {
        name: "wte.weight".into(),
        shape: vec![s.vocab, c],
        global_index: 0,
        init: Init::Normal(std),
        decay: true,
        split: Split::Interior,
    };
    let mut specs = Vec::new();
    if layout.embedding {
        specs.push(wte);
        specs.push(ParamSpec {
            name: "wpe.weight".into(),
            shape: vec![s.max_positions, c],
            global_index: 1,
            init: Init::Normal(std),
            decay: true,
            split: Split::Replicated,
        });
    } else if layout.head {
        specs.push(wte);
    }
    let (split, whole) = (Split::Interior, Split::Replicated);
    let block: [(Vec<usize>, Init, bool, Split); 12] = [
        (vec![c], Init::Ones, false, whole),
        (vec![c], Init::Zeros, false, whole),
        (vec![c, 3 * c], Init::Normal(std), true, split),
        (vec![3 * c], Init::Zeros, false, split),
        (vec![c, c], Init::Normal(proj_std), true, split),
        (vec![c], Init::Zeros, false, whole),
        (vec![c], Init::Ones, false, whole),
        (vec![c], Init::Zeros, false, whole),
        (vec![c, f], Init::Normal(std), true, split),
        (vec![f], Init::Zeros, false, split),
        (vec![f, c], Init::Normal(proj_std), true, split),
        (vec![c], Init::Zeros, false, whole),
    ];
    for i in layout.blocks.clone() {
        for (k, (shape, init, decay, split)) in block.iter().cloned().enumerate() {
            let name = format!("h.{i}.{}", BLOCK_PARAM_NAMES[k]);
            specs.push(ParamSpec { name, shape, global_index: 2 + 12 * i + k, init, decay, split });
        }
    }
    if layout.head {
        for (k, (name, init)) in
            [("ln_f.weight", Init::Ones), ("ln_f.bias", Init::Zeros)].into_iter().enumerate()
        {
            let global_index = 2 + 12 * s.num_layers + k;
            let split = Split::Replicated;
            specs.push(ParamSpec {
                name: name.into(),
                shape: vec![c],
                global_index,
                init,
                decay: false,
                split,
            });
        }
    }
    specs
}

/// A chunk's parameters, gradients and optimizer state, index-aligned with `specs`.
pub struct Parameters {
    pub specs: Vec<ParamSpec>,
    /// Values [spec.shape].
    pub values: Vec<Tensor>,
    /// Gradients accumulated over the microbatches of a step. For `wte.weight` this is the
    /// embedding's gradient, or the head's in a head-only chunk.
    pub grads: Vec<Tensor>,
    /// The LM head's gradient of the tied `wte.weight` when the chunk holds both embedding
    /// and head; the two are summed before the step, embedding first.
    pub head_wte_grad: Option<Tensor>,
    pub exp_avg: Vec<Tensor>,
    pub exp_avg_sq: Vec<Tensor>,
}

impl Parameters {
    /// Initialises a chunk's parameters from the seed (the same values whatever the layout).
    pub fn init(dev: &dyn Device, s: &GptShape, layout: &ChunkLayout, seed: u64) -> Parameters {
        let specs = chunk_param_specs(s, layout);
        let values = specs
            .iter()
            .map(|p| {
                let n: usize = p.shape.iter().product();
                let host = match p.init {
                    Init::Normal(std) => normal_init(seed, p.global_index as u32, n, std),
                    Init::Zeros => vec![0.0; n],
                    Init::Ones => vec![1.0; n],
                };
                dev.from_host(&host, &p.shape, Category::Parameters)
            })
            .collect();
        Self::with_values(dev, layout, specs, values)
    }

    /// Wraps given values (e.g. loaded from a checkpoint) with zero gradients and moments.
    pub fn with_values(
        dev: &dyn Device,
        layout: &ChunkLayout,
        specs: Vec<ParamSpec>,
        values: Vec<Tensor>,
    ) -> Self {
        let zeros = |cat| specs.iter().map(|p| dev.zeros(&p.shape, cat)).collect::<Vec<_>>();
        let head_wte_grad =
            (layout.embedding && layout.head).then(|| dev.zeros(&specs[0].shape, Category::Gradients));
        Parameters {
            grads: zeros(Category::Gradients),
            exp_avg: zeros(Category::OptimizerState),
            exp_avg_sq: zeros(Category::OptimizerState),
            specs,
            values,
            head_wte_grad,
        }
    }

    /// Index of `wte.weight` in this chunk, if it holds it (embedding or tied head).
    pub fn wte_index(&self) -> Option<usize> {
        self.specs.iter().position(|p| p.global_index == 0)
    }

    /// Index of block `block`'s first tensor (its ln_1.weight) in this chunk.
    pub fn block_base(&self, block: usize) -> usize {
        let global = 2 + 12 * block;
        self.specs.iter().position(|p| p.global_index == global).expect("block not in this chunk")
    }

    /// Index of ln_f.weight (the head's LayerNorm).
    pub fn ln_f_index(&self) -> usize {
        self.specs.iter().position(|p| p.name == "ln_f.weight").expect("no head in this chunk")
    }

    pub fn zero_grads(&mut self, dev: &dyn Device) {
        for g in self.grads.iter_mut().chain(self.head_wte_grad.iter_mut()) {
            dev.fill_zero(g);
        }
    }

    pub fn num_elements(&self) -> usize {
        self.values.iter().map(Tensor::len).sum()
    }
}
