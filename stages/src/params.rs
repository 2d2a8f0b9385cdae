//! The model's parameters as its description declares them (name, shape, init, weight
//! decay, tensor-parallel split, Hugging Face name), and one chunk's values, gradients and
//! AdamW moments.
//!
//! Every parameter has a global index in the whole model's order (token embedding, position
//! embedding, each block's, final norm, output layer), which keys its initialisation and
//! orders the global grad-norm sum, so both are the same whatever the partition into stages.

use crate::init::normal_init;
use crate::layers::norm::NormPlacement;
use crate::model::{ModelShape, Naming, Positions};
use crate::optimizer_shard::OptimizerShard;
use crate::tensor_parallel::{Cut, Shard, Split};
use kernels::{Category, Device, QkNormSpan, Tensor};
use std::ops::Range;

/// The part of the model a chunk holds: an optional embedding, a contiguous range of
/// transformer blocks, an optional head (final norm + output layer + loss).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkLayout {
    pub blocks: Range<usize>,
    pub embedding: bool,
    pub head: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    Normal(f32),
    Zeros,
    Ones,
}

/// A norm weight's init, the identity scale: ones, or zeros where the norm scales by
/// 1 + weight.
fn norm_weight_init(s: &ModelShape) -> Init {
    if s.arch.zero_centered_gamma {
        Init::Zeros
    } else {
        Init::Ones
    }
}

/// A block's parameters, in the order a block lists them (Hugging Face's GPT-2 order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockParam {
    Norm1Weight,
    Norm1Bias,
    /// The fused q, k, v projection.
    QkvWeight,
    QkvBias,
    /// QK-norm's weights [hs]: the query heads', the key heads'.
    QNormWeight,
    KNormWeight,
    /// The attention's output projection.
    ProjWeight,
    ProjBias,
    Norm2Weight,
    Norm2Bias,
    /// The MLP's first projection (fused gate and up under SwiGLU).
    Fc1Weight,
    Fc1Bias,
    /// The MLP's second projection.
    Fc2Weight,
    Fc2Bias,
}

impl BlockParam {
    pub const ALL: [BlockParam; 14] = [
        BlockParam::Norm1Weight,
        BlockParam::Norm1Bias,
        BlockParam::QkvWeight,
        BlockParam::QkvBias,
        BlockParam::QNormWeight,
        BlockParam::KNormWeight,
        BlockParam::ProjWeight,
        BlockParam::ProjBias,
        BlockParam::Norm2Weight,
        BlockParam::Norm2Bias,
        BlockParam::Fc1Weight,
        BlockParam::Fc1Bias,
        BlockParam::Fc2Weight,
        BlockParam::Fc2Bias,
    ];

    /// Whether a model of shape `s` has this parameter.
    fn present(self, s: &ModelShape) -> bool {
        use BlockParam::*;
        match self {
            Norm1Bias | Norm2Bias => s.arch.norm.has_bias(),
            QkvBias => s.arch.biases.on_qkv(),
            QNormWeight | KNormWeight => s.arch.qk_norm,
            ProjBias | Fc1Bias | Fc2Bias => s.arch.biases.on_the_rest(),
            Norm1Weight | QkvWeight | ProjWeight | Norm2Weight | Fc1Weight | Fc2Weight => true,
        }
    }

    /// The bias of a matmul weight.
    pub fn bias(self) -> Option<BlockParam> {
        use BlockParam::*;
        match self {
            QkvWeight => Some(QkvBias),
            ProjWeight => Some(ProjBias),
            Fc1Weight => Some(Fc1Bias),
            Fc2Weight => Some(Fc2Bias),
            _ => None,
        }
    }
}

/// A parameter's place in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    TokenEmbedding,
    PositionEmbedding,
    Block {
        layer: usize,
        param: BlockParam,
    },
    FinalNormWeight,
    FinalNormBias,
    /// The untied output layer [V,C] (a tied model's is the token embedding).
    OutputLayer,
}

impl Role {
    /// A parameter every tensor-parallel rank holds whole but computes the gradient of over
    /// only its part of the layer, for the group to sum (Megatron's
    /// `_allreduce_layernorm_grads`): QK-norm's weights, over its heads (where they are whole:
    /// [`ParamSpec::grad_is_partial`]); a norm's weight or bias, over its rows of the
    /// sequence, where `sequence` parallelism splits them.
    pub fn grad_is_partial(&self, sequence: bool) -> bool {
        use BlockParam::*;
        match self {
            Role::Block { param: QNormWeight | KNormWeight, .. } => true,
            Role::FinalNormWeight | Role::FinalNormBias => sequence,
            Role::Block { param, .. } => {
                sequence && matches!(param, Norm1Weight | Norm1Bias | Norm2Weight | Norm2Bias)
            }
            Role::TokenEmbedding | Role::PositionEmbedding | Role::OutputLayer => false,
        }
    }
}

/// One Hugging Face tensor that a parameter holds: `rows` consecutive rows of it (the
/// leading dimension), the parameter being its parts stacked in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfPart {
    pub name: String,
    pub rows: usize,
}

/// One parameter tensor's identity.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// pipetrain's name: the Hugging Face name where the parameter is one Hugging Face tensor
    /// (`h.3.mlp.c_fc.weight`), else the fused tensor's (`model.layers.3.self_attn.qkv_proj.weight`).
    pub name: String,
    pub role: Role,
    pub shape: Vec<usize>,
    /// Position in the whole model's parameter order.
    pub global_index: usize,
    pub init: Init,
    /// AdamW weight decay applies (matrices and embeddings, not biases or norms).
    pub decay: bool,
    /// How Megatron splits it over tensor-parallel ranks: the token embedding and output
    /// layer by vocabulary, column-parallel weights and biases by columns (q, k, v by heads
    /// and groups), row-parallel weights by rows (never by sequence: a parameter is
    /// `Interior` or `Replicated`).
    pub split: Split,
    /// The Hugging Face tensors it stacks, in order (one, named `name`, for most).
    pub hf: Vec<HfPart>,
}

impl ParamSpec {
    /// Whether each tensor rank's gradient of this parameter covers only its part of the
    /// layer, for the group to sum: a whole parameter whose role says so. A cut one's shards
    /// are each their own rank's (QK-norm's weights over the whole projections).
    pub fn grad_is_partial(&self, sequence: bool) -> bool {
        self.split == Split::Replicated && self.role.grad_is_partial(sequence)
    }

    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the distributed optimizer keeps only each replica's part of this parameter's
    /// fp32 master, where the device keeps a bf16 copy beside it
    /// ([`Device::shard_master`](kernels::Device::shard_master)): every matrix but the
    /// embedding tables, whose lookup reads the master.
    pub fn master_shards(&self) -> bool {
        self.shape.len() == 2 && !matches!(self.role, Role::TokenEmbedding | Role::PositionEmbedding)
    }

    /// The Hugging Face tensors of `data` (this parameter's values), each with its shape.
    pub fn to_hf<'a>(&'a self, data: &'a [f32]) -> impl Iterator<Item = (&'a str, Vec<usize>, &'a [f32])> {
        let row: usize = self.shape[1..].iter().product();
        let mut start = 0;
        self.hf.iter().map(move |part| {
            let mut shape = self.shape.clone();
            shape[0] = part.rows;
            let slice = &data[start * row..(start + part.rows) * row];
            start += part.rows;
            (part.name.as_str(), shape, slice)
        })
    }

    /// Where shard `shard` of a model of shape `s` cuts this parameter (None: it holds it
    /// whole). Megatron's cuts: the embedding and output layer by vocabulary rows; q, k, v
    /// and the MLP's first projection (gate and up) by output columns, each part by its
    /// heads, groups or columns; the attention's and the MLP's output projections by input
    /// columns; QK-norm's weights over the whole projections by their heads' channels. A weight's output axis is its second under GPT-2's Conv1D layout [in, out]
    /// and its first under Llama's Linear layout [out, in].
    pub fn cut(&self, s: &ModelShape, shard: Shard) -> Option<Cut> {
        use BlockParam::*;
        if shard.size == 1 || self.split == Split::Replicated {
            return None;
        }
        let (out_axis, in_axis) = match s.naming() {
            Naming::Gpt2 => (1, 0),
            Naming::Llama => (0, 1),
        };
        let (axis, ranges) = match self.role {
            Role::TokenEmbedding | Role::OutputLayer => (0, vec![shard.vocab(s)]),
            Role::Block { param: QkvWeight, .. } => (out_axis, shard.qkv_ranges(s)),
            Role::Block { param: QkvBias, .. } => (0, shard.qkv_ranges(s)),
            Role::Block { param: Fc1Weight, .. } => (out_axis, shard.fc1_ranges(s)),
            Role::Block { param: Fc1Bias, .. } => (0, shard.fc1_ranges(s)),
            Role::Block { param: ProjWeight, .. } => (in_axis, shard.even(s.attention_width())),
            Role::Block { param: Fc2Weight, .. } => (in_axis, shard.even(s.ffn)),
            Role::Block { param: QNormWeight, .. } => (0, shard.even(s.heads * s.head_size())),
            Role::Block { param: KNormWeight, .. } => (0, shard.even(s.kv_heads * s.head_size())),
            role => unreachable!("{role:?} is declared split but has no cut"),
        };
        Some(Cut { axis, ranges })
    }

    /// This parameter's shape on shard `shard`.
    pub fn shard_shape(&self, s: &ModelShape, shard: Shard) -> Vec<usize> {
        self.cut(s, shard).map_or_else(|| self.shape.clone(), |cut| cut.shape(&self.shape))
    }

    /// Shard `shard`'s elements of the whole parameter's values `whole`.
    pub fn shard_of(&self, s: &ModelShape, shard: Shard, whole: Vec<f32>) -> Vec<f32> {
        match self.cut(s, shard) {
            Some(cut) => cut.slice(&self.shape, &whole),
            None => whole,
        }
    }

    /// Each Hugging Face part's name and shape.
    pub fn hf_shapes(&self) -> impl Iterator<Item = (String, Vec<usize>)> + '_ {
        self.hf.iter().map(|part| {
            let mut shape = self.shape.clone();
            shape[0] = part.rows;
            (part.name.clone(), shape)
        })
    }
}

/// The full model's parameter list, in global order.
pub fn model_param_specs(s: &ModelShape) -> Vec<ParamSpec> {
    chunk_param_specs(s, &ChunkLayout { blocks: 0..s.num_layers, embedding: true, head: true })
}

/// Parameters of the whole model (a tied output layer counted once).
pub fn total_params(s: &ModelShape) -> usize {
    model_param_specs(s).iter().map(ParamSpec::elements).sum()
}

/// The parameters of one block of shape `s`, in block order.
pub fn block_params(s: &ModelShape) -> impl Iterator<Item = BlockParam> + '_ {
    BlockParam::ALL.into_iter().filter(|p| p.present(s))
}

/// Parameters per block.
pub fn block_param_count(s: &ModelShape) -> usize {
    block_params(s).count()
}

/// Global index of block 0's first parameter: after the token embedding and a learned
/// position table.
fn first_block_index(s: &ModelShape) -> usize {
    1 + usize::from(s.arch.positions == Positions::Learned)
}

/// The specs of one chunk, in global order. A head-only chunk of a tied model also holds a
/// copy of the token embedding (the output layer), listed first like the embedding's. Only
/// the chunk's own specs are built (the planner sizes thousands of chunks).
pub fn chunk_param_specs(s: &ModelShape, layout: &ChunkLayout) -> Vec<ParamSpec> {
    let (c, v, std) = (s.hidden, s.vocab, s.arch.init_std);
    let naming = s.naming();
    let whole = |name: &str, rows: usize| vec![HfPart { name: name.to_string(), rows }];
    let spec = |role, name: String, shape: Vec<usize>, global_index, init, decay, split| {
        let hf = whole(&name, shape[0]);
        ParamSpec { name, role, shape, global_index, init, decay, split, hf }
    };
    let token_embedding = || {
        let name = match naming {
            Naming::Gpt2 => "wte.weight",
            Naming::Llama => "model.embed_tokens.weight",
        };
        spec(Role::TokenEmbedding, name.into(), vec![v, c], 0, Init::Normal(std), true, Split::Interior)
    };
    let mut specs = Vec::new();
    if layout.embedding || (layout.head && s.arch.tied_output) {
        specs.push(token_embedding());
    }
    if layout.embedding && s.arch.positions == Positions::Learned {
        let name = match naming {
            Naming::Gpt2 => "wpe.weight",
            Naming::Llama => "model.embed_positions.weight",
        };
        let shape = vec![s.max_positions, c];
        specs.push(spec(
            Role::PositionEmbedding,
            name.into(),
            shape,
            1,
            Init::Normal(std),
            true,
            Split::Replicated,
        ));
    }
    let per_block = block_param_count(s);
    for layer in layout.blocks.clone() {
        let base = first_block_index(s) + per_block * layer;
        specs.extend(block_params(s).enumerate().map(|(k, param)| block_spec(s, layer, param, base + k)));
    }
    if layout.head {
        let index = first_block_index(s) + per_block * s.num_layers;
        let (weight, bias) = match naming {
            Naming::Gpt2 => ("ln_f.weight", "ln_f.bias"),
            Naming::Llama => ("model.norm.weight", "model.norm.bias"),
        };
        specs.push(spec(
            Role::FinalNormWeight,
            weight.into(),
            vec![c],
            index,
            norm_weight_init(s),
            false,
            Split::Replicated,
        ));
        if s.arch.norm.has_bias() {
            let role = Role::FinalNormBias;
            specs.push(spec(role, bias.into(), vec![c], index + 1, Init::Zeros, false, Split::Replicated));
        }
        if !s.arch.tied_output {
            let index = index + 1 + usize::from(s.arch.norm.has_bias());
            let shape = vec![v, c];
            let role = Role::OutputLayer;
            specs.push(spec(
                role,
                "lm_head.weight".into(),
                shape,
                index,
                Init::Normal(std),
                true,
                Split::Interior,
            ));
        }
    }
    specs
}

/// QK-norm's weights: whole on every tensor rank over each head (each rank's gradient
/// covering its heads, for the group to sum), cut with the heads over the whole projections.
fn qk_norm_split(s: &ModelShape) -> Split {
    match s.arch.qk_norm_span {
        QkNormSpan::Head => Split::Replicated,
        QkNormSpan::Projection => Split::Interior,
    }
}

/// Parameter `param` of block `layer`: its shape in the model's weight layout, its init
/// (the residual projections scaled by 1/sqrt(2 * layers)), and its names.
fn block_spec(s: &ModelShape, layer: usize, param: BlockParam, global_index: usize) -> ParamSpec {
    use BlockParam::*;
    let (c, f, std) = (s.hidden, s.ffn, s.arch.init_std);
    let proj_std = std / (2.0 * s.num_layers as f32).sqrt();
    let (qkv, fc1) = (s.qkv_width(), s.fc1_width());
    // A matmul weight [in, out] in GPT-2's Conv1D layout, [out, in] in Llama's Linear one.
    let matrix = |inp: usize, out: usize| match s.naming() {
        Naming::Gpt2 => vec![inp, out],
        Naming::Llama => vec![out, inp],
    };
    let (shape, init, decay, split) = match param {
        Norm1Weight | Norm2Weight => (vec![c], norm_weight_init(s), false, Split::Replicated),
        // [hs] over each head, [NH hs] and [KV hs] over the whole projections.
        QNormWeight => (vec![s.qk_norm_rows().q_width], Init::Ones, false, qk_norm_split(s)),
        KNormWeight => (vec![s.qk_norm_rows().k_width], Init::Ones, false, qk_norm_split(s)),
        Norm1Bias | Norm2Bias | ProjBias | Fc2Bias => (vec![c], Init::Zeros, false, Split::Replicated),
        QkvWeight => (matrix(c, qkv), Init::Normal(std), true, Split::Interior),
        QkvBias => (vec![qkv], Init::Zeros, false, Split::Interior),
        ProjWeight => (matrix(s.attention_width(), c), Init::Normal(proj_std), true, Split::Interior),
        Fc1Weight => (matrix(c, fc1), Init::Normal(std), true, Split::Interior),
        Fc1Bias => (vec![fc1], Init::Zeros, false, Split::Interior),
        Fc2Weight => (matrix(f, c), Init::Normal(proj_std), true, Split::Interior),
    };
    let (name, hf) = match s.naming() {
        Naming::Gpt2 => {
            let name = format!("h.{layer}.{}", gpt2_name(param));
            (name.clone(), vec![HfPart { name, rows: shape[0] }])
        }
        Naming::Llama => llama_names(s, layer, param, shape[0]),
    };
    let role = Role::Block { layer, param };
    ParamSpec { name, role, shape, global_index, init, decay, split, hf }
}

fn gpt2_name(param: BlockParam) -> &'static str {
    use BlockParam::*;
    match param {
        Norm1Weight => "ln_1.weight",
        Norm1Bias => "ln_1.bias",
        QkvWeight => "attn.c_attn.weight",
        QkvBias => "attn.c_attn.bias",
        QNormWeight | KNormWeight => {
            unreachable!("GPT-2's names are for GPT-2's architecture, which has no QK-norm")
        }
        ProjWeight => "attn.c_proj.weight",
        ProjBias => "attn.c_proj.bias",
        Norm2Weight => "ln_2.weight",
        Norm2Bias => "ln_2.bias",
        Fc1Weight => "mlp.c_fc.weight",
        Fc1Bias => "mlp.c_fc.bias",
        Fc2Weight => "mlp.c_proj.weight",
        Fc2Bias => "mlp.c_proj.bias",
    }
}

/// Llama's names: pipetrain's fused q, k, v (and SwiGLU's gate and up) are Hugging Face's
/// separate projections stacked by rows, as `LlamaForCausalLM` lists them.
fn llama_names(s: &ModelShape, layer: usize, param: BlockParam, rows: usize) -> (String, Vec<HfPart>) {
    use BlockParam::*;
    let prefix = format!("model.layers.{layer}");
    let kind = match param {
        Norm1Bias | QkvBias | ProjBias | Norm2Bias | Fc1Bias | Fc2Bias => "bias",
        _ => "weight",
    };
    let one = |module: &str| {
        let name = format!("{prefix}.{module}.{kind}");
        (name.clone(), vec![HfPart { name, rows }])
    };
    let stacked = |fused: &str, parts: &[(&str, usize)]| {
        let hf = parts
            .iter()
            .map(|(m, rows)| HfPart { name: format!("{prefix}.{m}.{kind}"), rows: *rows })
            .collect();
        (format!("{prefix}.{fused}.{kind}"), hf)
    };
    let hs = s.head_size();
    // OLMo 2's names where the norms are on the branches' outputs.
    let on_inputs = s.arch.norm_placement == NormPlacement::Input;
    match param {
        Norm1Weight | Norm1Bias if on_inputs => one("input_layernorm"),
        Norm2Weight | Norm2Bias if on_inputs => one("post_attention_layernorm"),
        Norm1Weight | Norm1Bias => one("post_attention_layernorm"),
        Norm2Weight | Norm2Bias => one("post_feedforward_layernorm"),
        QkvWeight | QkvBias => stacked(
            "self_attn.qkv_proj",
            &[
                ("self_attn.q_proj", s.heads * hs),
                ("self_attn.k_proj", s.kv_heads * hs),
                ("self_attn.v_proj", s.kv_heads * hs),
            ],
        ),
        QNormWeight => one("self_attn.q_norm"),
        KNormWeight => one("self_attn.k_norm"),
        ProjWeight | ProjBias => one("self_attn.o_proj"),
        Fc1Weight | Fc1Bias => match s.arch.activation.fc1_width(1) {
            2 => stacked("mlp.gate_up_proj", &[("mlp.gate_proj", s.ffn), ("mlp.up_proj", s.ffn)]),
            _ => one("mlp.up_proj"),
        },
        Fc2Weight | Fc2Bias => one("mlp.down_proj"),
    }
}

/// Where each of a block's parameters sits in its chunk's list.
#[derive(Clone, Copy, Debug)]
pub struct BlockIndices {
    /// The chunk index of the block's first parameter.
    base: usize,
    /// Offsets within the block, by [`BlockParam::ALL`] position; None where absent.
    offsets: [Option<usize>; BlockParam::ALL.len()],
}

impl BlockIndices {
    /// Where block `layer`'s parameters sit in `specs` (a chunk's list, or the model's).
    pub fn find(s: &ModelShape, specs: &[ParamSpec], layer: usize) -> BlockIndices {
        let first = specs
            .iter()
            .position(|p| matches!(p.role, Role::Block { layer: l, .. } if l == layer))
            .expect("block not in these parameters");
        BlockIndices::at(s, first)
    }

    fn at(s: &ModelShape, base: usize) -> BlockIndices {
        let mut offsets = [None; BlockParam::ALL.len()];
        for (k, param) in block_params(s).enumerate() {
            offsets[param as usize] = Some(k);
        }
        BlockIndices { base, offsets }
    }

    /// The chunk index of `param`, if the model has it.
    pub fn get(&self, param: BlockParam) -> Option<usize> {
        self.offsets[param as usize].map(|k| self.base + k)
    }

    /// The chunk index of a parameter every block has.
    pub fn of(&self, param: BlockParam) -> usize {
        self.get(param).unwrap_or_else(|| panic!("the model's blocks have no {param:?}"))
    }

    /// The chunk indices of the whole block.
    pub fn range(&self) -> Range<usize> {
        self.base..self.base + self.offsets.iter().flatten().count()
    }
}

/// A chunk's parameters, gradients and optimizer state, index-aligned with `specs`.
pub struct Parameters {
    pub specs: Vec<ParamSpec>,
    /// Values [spec.shape].
    pub values: Vec<Tensor>,
    /// Gradients accumulated over the microbatches of a step. For a tied token embedding
    /// this is the embedding's gradient, or the output layer's in a head-only chunk.
    pub grads: Vec<Tensor>,
    /// The output layer's gradient of the tied token embedding when the chunk holds both
    /// embedding and head; the two are summed before the step, embedding first.
    pub head_wte_grad: Option<Tensor>,
    /// AdamW's moments of the part of each parameter this replica steps
    /// ([`OptimizerShard::part`]): [part] each, the whole parameter's elements unsharded.
    pub exp_avg: Vec<Tensor>,
    pub exp_avg_sq: Vec<Tensor>,
    pub optimizer: OptimizerShard,
    /// Whether the device keeps only this replica's part of each parameter's fp32 master.
    pub master_sharded: Vec<bool>,
}

impl Parameters {
    /// Initialises shard `shard` of a chunk's parameters from the seed: the whole model's
    /// values, the same whatever the layout, cut to the shard.
    pub fn init(
        dev: &dyn Device,
        s: &ModelShape,
        layout: &ChunkLayout,
        seed: u64,
        shard: Shard,
        optimizer: OptimizerShard,
    ) -> Parameters {
        let specs = chunk_param_specs(s, layout);
        let values = specs
            .iter()
            .map(|p| {
                let n = p.elements();
                let whole = match p.init {
                    Init::Normal(std) => normal_init(seed, p.global_index as u32, n, std),
                    Init::Zeros => vec![0.0; n],
                    Init::Ones => vec![1.0; n],
                };
                let host = p.shard_of(s, shard, whole);
                dev.from_host(&host, &p.shard_shape(s, shard), Category::Parameters)
            })
            .collect();
        Self::with_values(dev, s, layout, specs, values, optimizer)
    }

    /// Wraps given values (e.g. loaded from a checkpoint; a shard's, where the specs'
    /// parameters are cut) with zero gradients of their shapes and zero moments of the
    /// parts `optimizer` steps.
    pub fn with_values(
        dev: &dyn Device,
        s: &ModelShape,
        layout: &ChunkLayout,
        specs: Vec<ParamSpec>,
        values: Vec<Tensor>,
        optimizer: OptimizerShard,
    ) -> Self {
        let mut values = values;
        let master_sharded = (specs.iter().zip(&mut values))
            .map(|(spec, v)| {
                let part = optimizer.part(v.len());
                optimizer.distributed && spec.master_shards() && dev.shard_master(v, part)
            })
            .collect();
        let zeros = |cat| values.iter().map(|v| dev.zeros(v.shape(), cat)).collect::<Vec<_>>();
        let moments = || -> Vec<Tensor> {
            let part = |v: &Tensor| optimizer.part(v.len()).len();
            values.iter().map(|v| dev.zeros(&[part(v)], Category::OptimizerState)).collect()
        };
        let head_wte_grad = (s.arch.tied_output && layout.embedding && layout.head)
            .then(|| dev.zeros(values[0].shape(), Category::Gradients));
        Parameters {
            grads: zeros(Category::Gradients),
            exp_avg: moments(),
            exp_avg_sq: moments(),
            optimizer,
            master_sharded,
            specs,
            values,
            head_wte_grad,
        }
    }

    /// The elements of parameter `i` whose fp32 master this replica holds: all, or its part
    /// where the master is sharded.
    pub fn master_part(&self, i: usize) -> Range<usize> {
        match self.master_sharded[i] {
            true => self.optimizer.part(self.values[i].len()),
            false => 0..self.values[i].len(),
        }
    }

    /// Index of the parameter of `role` in this chunk, if it holds it.
    pub fn index(&self, role: Role) -> Option<usize> {
        self.specs.iter().position(|p| p.role == role)
    }

    /// Index of the output layer: the untied one, or the tied token embedding.
    pub fn output_layer_index(&self) -> usize {
        self.index(Role::OutputLayer)
            .or_else(|| self.index(Role::TokenEmbedding))
            .expect("a head chunk holds its output layer")
    }

    /// Where block `layer`'s parameters sit in this chunk.
    pub fn block(&self, s: &ModelShape, layer: usize) -> BlockIndices {
        BlockIndices::find(s, &self.specs, layer)
    }

    /// Every gradient this chunk accumulates into: its parameters', and the tied head's
    /// copy of wte's where it has one.
    pub fn grads_mut(&mut self) -> impl Iterator<Item = &mut Tensor> {
        self.grads.iter_mut().chain(self.head_wte_grad.iter_mut())
    }

    pub fn num_elements(&self) -> usize {
        self.values.iter().map(Tensor::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Architecture, LinearBiases};

    fn names(s: &ModelShape) -> Vec<String> {
        model_param_specs(s).into_iter().map(|p| p.name).collect()
    }

    #[test]
    fn gpt2_lists_hugging_face_names_in_order() {
        let s = ModelShape { num_layers: 1, ..ModelShape::GPT2_SMALL };
        let expected = [
            "wte.weight",
            "wpe.weight",
            "h.0.ln_1.weight",
            "h.0.ln_1.bias",
            "h.0.attn.c_attn.weight",
            "h.0.attn.c_attn.bias",
            "h.0.attn.c_proj.weight",
            "h.0.attn.c_proj.bias",
            "h.0.ln_2.weight",
            "h.0.ln_2.bias",
            "h.0.mlp.c_fc.weight",
            "h.0.mlp.c_fc.bias",
            "h.0.mlp.c_proj.weight",
            "h.0.mlp.c_proj.bias",
            "ln_f.weight",
            "ln_f.bias",
        ];
        assert_eq!(names(&s), expected);
        let specs = model_param_specs(&s);
        assert!(specs.iter().enumerate().all(|(i, p)| p.global_index == i && p.hf.len() == 1));
        assert_eq!(specs[4].shape, [768, 2304]);
        assert_eq!(specs.iter().map(ParamSpec::elements).sum::<usize>(), 124_439_808 - 11 * 7_087_872);
    }

    /// `init_method_std` is every normal init's std, the residual projections' scaled by
    /// 1/sqrt(2 * layers): doubling it doubles every drawn weight exactly.
    #[test]
    fn init_std_scales_every_normal_init() {
        let dev = kernels::cpu::CpuDevice::new(1);
        let s = ModelShape {
            num_layers: 2,
            hidden: 8,
            heads: 2,
            kv_heads: 2,
            ffn: 16,
            vocab: 11,
            max_positions: 4,
            ..ModelShape::GPT2_SMALL
        };
        let layout = ChunkLayout { blocks: 0..2, embedding: true, head: true };
        let wider = ModelShape { arch: crate::model::Architecture { init_std: 0.04, ..s.arch }, ..s };
        let (a, b) = (
            Parameters::init(&dev, &s, &layout, 5, Shard::WHOLE, OptimizerShard::WHOLE),
            Parameters::init(&dev, &wider, &layout, 5, Shard::WHOLE, OptimizerShard::WHOLE),
        );
        for (i, spec) in a.specs.iter().enumerate() {
            let (x, y) = (dev.to_host(&a.values[i]), dev.to_host(&b.values[i]));
            match spec.init {
                Init::Normal(std) => {
                    assert!(x.iter().zip(&y).all(|(x, y)| 2.0 * x == *y), "{}", spec.name);
                    let expected = if spec.name.ends_with("c_proj.weight") { 0.02 / 2.0 } else { 0.02 };
                    assert_eq!(std, expected, "{}", spec.name);
                }
                _ => assert_eq!(x, y, "{}", spec.name),
            }
        }
    }

    #[test]
    fn llama_fuses_qkv_and_gate_up_and_unties_the_head() {
        let s = ModelShape {
            arch: Architecture::llama(1e4, 1e-5),
            num_layers: 2,
            hidden: 32,
            heads: 4,
            kv_heads: 2,
            ffn: 48,
            vocab: 96,
            ..ModelShape::GPT2_SMALL
        };
        let specs = model_param_specs(&s);
        let listed: Vec<(String, Vec<usize>, usize)> = specs
            .iter()
            .filter(|p| !p.name.contains("layers.1."))
            .map(|p| (p.name.clone(), p.shape.clone(), p.global_index))
            .collect();
        let want = [
            ("model.embed_tokens.weight", vec![96, 32], 0),
            ("model.layers.0.input_layernorm.weight", vec![32], 1),
            ("model.layers.0.self_attn.qkv_proj.weight", vec![64, 32], 2),
            ("model.layers.0.self_attn.o_proj.weight", vec![32, 32], 3),
            ("model.layers.0.post_attention_layernorm.weight", vec![32], 4),
            ("model.layers.0.mlp.gate_up_proj.weight", vec![96, 32], 5),
            ("model.layers.0.mlp.down_proj.weight", vec![32, 48], 6),
            ("model.norm.weight", vec![32], 13),
            ("lm_head.weight", vec![96, 32], 14),
        ];
        assert_eq!(listed, want.map(|(n, s, i)| (n.to_string(), s, i)));
        let qkv = &specs[2];
        let hf: Vec<(String, Vec<usize>)> = qkv.hf_shapes().collect();
        assert_eq!(
            hf,
            [
                ("model.layers.0.self_attn.q_proj.weight".to_string(), vec![32, 32]),
                ("model.layers.0.self_attn.k_proj.weight".to_string(), vec![16, 32]),
                ("model.layers.0.self_attn.v_proj.weight".to_string(), vec![16, 32]),
            ]
        );
        let data: Vec<f32> = (0..qkv.elements()).map(|i| i as f32).collect();
        let parts: Vec<(&str, Vec<usize>, &[f32])> = qkv.to_hf(&data).collect();
        assert_eq!(parts[1].2, &data[32 * 32..48 * 32]);
        assert_eq!(parts[2].1, [16, 32]);
        // A head-only chunk of an untied model holds no copy of the token embedding.
        let head = chunk_param_specs(&s, &ChunkLayout { blocks: 2..2, embedding: false, head: true });
        assert_eq!(
            head.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["model.norm.weight", "lm_head.weight"]
        );
    }

    /// Qwen2: the fused q, k, v projection has a bias, stacked from Hugging Face's three like
    /// its weight; no other projection has one.
    #[test]
    fn qwen2_has_biases_on_q_k_and_v_alone() {
        let s = ModelShape {
            arch: Architecture { biases: LinearBiases::QkvOnly, ..Architecture::llama(1e6, 1e-6) },
            num_layers: 1,
            hidden: 32,
            heads: 4,
            kv_heads: 2,
            ffn: 48,
            vocab: 96,
            ..ModelShape::GPT2_SMALL
        };
        let specs = model_param_specs(&s);
        let biases: Vec<&ParamSpec> = specs.iter().filter(|p| p.name.ends_with(".bias")).collect();
        assert_eq!(biases.len(), 1);
        let bias = biases[0];
        assert_eq!(
            (bias.name.as_str(), &bias.shape[..]),
            ("model.layers.0.self_attn.qkv_proj.bias", &[64][..])
        );
        let hf: Vec<(String, Vec<usize>)> = bias.hf_shapes().collect();
        assert_eq!(
            hf,
            [
                ("model.layers.0.self_attn.q_proj.bias".to_string(), vec![32]),
                ("model.layers.0.self_attn.k_proj.bias".to_string(), vec![16]),
                ("model.layers.0.self_attn.v_proj.bias".to_string(), vec![16]),
            ]
        );
        assert_eq!(bias.init, Init::Zeros);
        // Qwen2.5 0.5B's 494,032,768 parameters (its output layer tied).
        let qwen25 = ModelShape {
            num_layers: 24,
            hidden: 896,
            heads: 14,
            kv_heads: 2,
            ffn: 4864,
            vocab: 151936,
            arch: Architecture { tied_output: true, ..s.arch },
            ..s
        };
        assert_eq!(model_param_specs(&qwen25).iter().map(ParamSpec::elements).sum::<usize>(), 494_032_768);
    }

    /// Qwen3: each block's QK-norm weights [hs] after the fused q, k, v projection, named as
    /// Qwen3ForCausalLM names them; replicated over tensor ranks, whose gradients of them
    /// cover only their heads, for the group to sum.
    #[test]
    fn qwen3_has_a_qk_norm_weight_per_block() {
        let s = ModelShape {
            arch: Architecture { qk_norm: true, ..Architecture::llama(1e6, 1e-6) },
            num_layers: 1,
            hidden: 32,
            heads: 4,
            kv_heads: 2,
            head_dim: Some(16),
            ffn: 48,
            vocab: 96,
            ..ModelShape::GPT2_SMALL
        };
        let specs = model_param_specs(&s);
        let names: Vec<(&str, &[usize], usize)> =
            specs.iter().map(|p| (p.name.as_str(), &p.shape[..], p.global_index)).skip(3).take(3).collect();
        assert_eq!(
            names,
            [
                ("model.layers.0.self_attn.q_norm.weight", &[16][..], 3),
                ("model.layers.0.self_attn.k_norm.weight", &[16][..], 4),
                ("model.layers.0.self_attn.o_proj.weight", &[32, 64][..], 5),
            ]
        );
        let q_norm = &specs[3];
        assert_eq!((&q_norm.init, q_norm.decay, q_norm.split), (&Init::Ones, false, Split::Replicated));
        assert!(q_norm.grad_is_partial(false), "each tensor rank's gradient covers its heads alone");
        // OLMo 2's, over the whole projections [NH hs] and [KV hs]: cut with the heads, rank 1
        // of 2 holding channels 32..64 of q_norm and 16..32 of k_norm, its gradient its own.
        let olmo2 = ModelShape { arch: Architecture { qk_norm_span: QkNormSpan::Projection, ..s.arch }, ..s };
        let specs = model_param_specs(&olmo2);
        let (q_norm, k_norm) = (&specs[3], &specs[4]);
        let rank1 = Shard { size: 2, rank: 1, sequence: false };
        assert_eq!((&q_norm.shape[..], &k_norm.shape[..]), (&[64][..], &[32][..]));
        assert_eq!((q_norm.split, q_norm.grad_is_partial(false)), (Split::Interior, false));
        assert_eq!(
            q_norm.cut(&olmo2, rank1),
            Some(Cut { axis: 0, ranges: std::iter::once(32..64).collect() })
        );
        assert_eq!(
            k_norm.cut(&olmo2, rank1),
            Some(Cut { axis: 0, ranges: std::iter::once(16..32).collect() })
        );
        let whole: Vec<f32> = (0..64).map(|i| i as f32).collect();
        assert_eq!(q_norm.shard_of(&olmo2, rank1, whole), (32..64).map(|i| i as f32).collect::<Vec<_>>());
        let norm1 = &specs[1];
        assert_eq!(norm1.name, "model.layers.0.input_layernorm.weight");
        assert_eq!((norm1.role.grad_is_partial(false), norm1.role.grad_is_partial(true)), (false, true));
        // Qwen3 0.6B's 596,049,920 parameters (its output layer tied), 440,466,432 of them
        // in the blocks: the card's 0.6B and 0.44B non-embedding.
        let qwen3 = ModelShape {
            num_layers: 28,
            hidden: 1024,
            heads: 16,
            kv_heads: 8,
            head_dim: Some(128),
            ffn: 3072,
            vocab: 151936,
            arch: Architecture { tied_output: true, ..s.arch },
            ..s
        };
        let specs = model_param_specs(&qwen3);
        assert_eq!(specs.iter().map(ParamSpec::elements).sum::<usize>(), 596_049_920);
        let blocks = specs.iter().filter(|p| matches!(p.role, Role::Block { .. }));
        assert_eq!(blocks.map(ParamSpec::elements).sum::<usize>(), 440_466_432);
    }
}
