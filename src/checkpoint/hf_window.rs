//! A config.json's sliding window, read and written: the keys each class says it with
//! ([`Window`]), and pipetrain's own (Megatron's `window_size` and `window_attn_skip_freq`).
//!
//! - Mistral and Phi-3: `sliding_window` W on every layer.
//! - OLMo 3: `sliding_window` W on the layers `layer_types` names "sliding_attention",
//!   every fourth attending to every key where it is absent.
//! - Qwen2 and Qwen3: `sliding_window` on the layers from `max_window_layers` on, where
//!   `use_sliding_window` turns it on (Qwen2.5 and Qwen3 turn it off).
//!
//! A window on layers `window_attn_skip_freq` cannot name (Qwen's, or an OLMo 3 whose
//! `layer_types` follow no period) reads as a model of at most W positions, over which the
//! window is the whole sequence: the same model, exactly, where it is defined.

use serde_json::{json, Map, Value};
use stages::SlidingWindow;

/// The `sliding_window` transformers' MistralConfig, Qwen2Config, Qwen3Config and Olmo3Config take where
/// config.json leaves it out.
pub const TRANSFORMERS_WINDOW: usize = 4096;

/// How a class's config.json turns on a sliding window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Window {
    /// The class attends to the whole sequence.
    Never,
    /// `sliding_window` is the window where it is a count, None where null, this where
    /// absent (MistralConfig: 4096, Mistral 7B v0.1's; Phi3Config: none, Phi-4's).
    Count(Option<usize>),
    /// `sliding_window` (absent: [`TRANSFORMERS_WINDOW`]) where `use_sliding_window` or a "sliding_attention"
    /// among `layer_types` turns it on (Qwen2Config, Qwen3Config); written off.
    Switched,
    /// `sliding_window` (absent: `keys`) on the layers `layer_types` names
    /// "sliding_attention" (absent: all but every `full_every`th), Olmo3Config's.
    Layers { keys: usize, full_every: usize },
}

impl Window {
    /// Whether a class whose keys are these can say `w`.
    pub fn says(self, w: Option<SlidingWindow>) -> bool {
        match self {
            Window::Never | Window::Switched => w.is_none(),
            Window::Count(_) => w.is_none_or(|w| w.full_every.is_none()),
            Window::Layers { .. } => true,
        }
    }
}

/// What a config.json's window makes of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowRead {
    /// Every layer attends to every key before the query.
    None,
    Window(SlidingWindow),
    /// A window on layers no period names: the model's positions are capped at it.
    Cap(usize),
}

impl WindowRead {
    pub fn window(self) -> Option<SlidingWindow> {
        match self {
            WindowRead::Window(w) => Some(w),
            _ => None,
        }
    }

    /// The positions the model is read with, of the `max_position_embeddings` it says.
    pub fn positions(self, said: usize) -> usize {
        match self {
            WindowRead::Cap(w) => said.min(w),
            _ => said,
        }
    }
}

/// The window of a config.json whose class says it as `window` (pipetrain's own model_type
/// where `pipetrain`) over `layers` layers.
pub fn read(
    obj: &Map<String, Value>,
    window: Window,
    pipetrain: bool,
    layers: usize,
) -> Result<WindowRead, String> {
    if pipetrain {
        return read_megatron(obj);
    }
    let on_every_layer = |w: Option<usize>| w.map_or(WindowRead::None, |keys| windowed(keys, None));
    match window {
        Window::Never => Ok(WindowRead::None),
        Window::Count(default) => Ok(on_every_layer(count(obj, default)?)),
        Window::Switched if qwen_slides(obj)? => {
            Ok(count(obj, Some(TRANSFORMERS_WINDOW))?.map_or(WindowRead::None, WindowRead::Cap))
        }
        Window::Switched => Ok(WindowRead::None),
        Window::Layers { keys, full_every } => {
            let Some(keys) = count(obj, Some(keys))? else { return Ok(WindowRead::None) };
            let sliding = match obj.get("layer_types").filter(|v| !v.is_null()) {
                Some(types) => layer_types(types, layers)?,
                None => (0..layers).map(|i| !(i + 1).is_multiple_of(full_every)).collect(),
            };
            Ok(period(&sliding).map_or(WindowRead::Cap(keys), |full_every| match full_every {
                Some(1) => WindowRead::None,
                _ => windowed(keys, full_every),
            }))
        }
    }
}

fn windowed(keys: usize, full_every: Option<usize>) -> WindowRead {
    WindowRead::Window(SlidingWindow { keys, full_every })
}

/// The keys a class that says its window as `keys` writes for `window` over `layers` layers,
/// into `extra` (pipetrain's own model_type where `pipetrain`).
pub fn write(
    extra: &mut Map<String, Value>,
    keys: Window,
    pipetrain: bool,
    window: Option<SlidingWindow>,
    layers: usize,
) {
    if pipetrain {
        if let Some(w) = window {
            extra.insert("window_size".into(), json!([w.keys - 1, 0]));
            extra.insert("window_attn_skip_freq".into(), json!(w.full_every));
        }
        return;
    }
    match keys {
        Window::Never => {}
        Window::Count(_) => {
            extra.insert("sliding_window".into(), json!(window.map(|w| w.keys)));
        }
        Window::Switched => {
            extra.insert("use_sliding_window".into(), json!(false));
        }
        Window::Layers { .. } => {
            let types: Vec<&str> = (0..layers)
                .map(|i| match window {
                    Some(w) if w.windows(i) => "sliding_attention",
                    _ => "full_attention",
                })
                .collect();
            extra.insert("sliding_window".into(), json!(window.map(|w| w.keys)));
            extra.insert("layer_types".into(), json!(types));
        }
    }
}

/// Megatron's keys as pipetrain writes them: `window_size` [left, 0], `window_attn_skip_freq`.
fn read_megatron(obj: &Map<String, Value>) -> Result<WindowRead, String> {
    let Some(size) = obj.get("window_size").filter(|v| !v.is_null()) else { return Ok(WindowRead::None) };
    let pair = size.as_array().map(|p| p.iter().map(Value::as_u64).collect::<Vec<_>>());
    let left = match pair.as_deref() {
        Some([Some(left), Some(0)]) if *left < u32::MAX as u64 => *left as usize,
        _ => return Err(format!("window_size is {size}, not [left, 0] with left a count of keys")),
    };
    let full_every = match obj.get("window_attn_skip_freq") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().filter(|n| (2..=u32::MAX as u64).contains(n)) {
            Some(n) => Some(n as usize),
            None => return Err(format!("window_attn_skip_freq is {v}, not a count of layers of 2 or more")),
        },
    };
    Ok(windowed(left + 1, full_every))
}

/// `sliding_window`: a count of keys, None where null, `default` where absent.
fn count(obj: &Map<String, Value>, default: Option<usize>) -> Result<Option<usize>, String> {
    match obj.get("sliding_window") {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().filter(|&w| (1..=u32::MAX as u64).contains(&w)) {
            Some(w) => Ok(Some(w as usize)),
            None => Err(format!("sliding_window is {v}, not a count of positions")),
        },
    }
}

/// Which of `layers` layers `layer_types` windows.
fn layer_types(types: &Value, layers: usize) -> Result<Vec<bool>, String> {
    let list = types.as_array().ok_or_else(|| format!("layer_types is {types}, not a list"))?;
    if list.len() != layers {
        return Err(format!("layer_types is {} long, not num_hidden_layers {layers}", list.len()));
    }
    list.iter().enumerate().map(|(i, t)| sliding(i, t)).collect()
}

fn sliding(i: usize, t: &Value) -> Result<bool, String> {
    match t.as_str() {
        Some("full_attention") => Ok(false),
        Some("sliding_attention") => Ok(true),
        _ => Err(format!("layer_types[{i}] is {t}, not \"full_attention\" or \"sliding_attention\"")),
    }
}

/// The `window_attn_skip_freq` whose pattern `sliding` is: Some(None) where every layer is
/// windowed, Some(Some(1)) where none is, None where no period names it.
fn period(sliding: &[bool]) -> Option<Option<usize>> {
    let Some(first_full) = sliding.iter().position(|s| !s) else { return Some(None) };
    let n = first_full + 1;
    let follows = sliding.iter().enumerate().all(|(i, &s)| s != (i + 1).is_multiple_of(n));
    follows.then_some(Some(n))
}

/// Whether a Qwen2Config or Qwen3Config turns its sliding window on at some layer:
/// `use_sliding_window`, or (transformers 5's record of the outcome) a "sliding_attention"
/// among `layer_types`.
fn qwen_slides(obj: &Map<String, Value>) -> Result<bool, String> {
    let on = match obj.get("use_sliding_window") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(on)) => *on,
        Some(v) => return Err(format!("use_sliding_window is {v}, not true or false")),
    };
    let Some(types) = obj.get("layer_types").filter(|v| !v.is_null()) else { return Ok(on) };
    let list = types.as_array().ok_or_else(|| format!("layer_types is {types}, not a list"))?;
    let mut slides = on;
    for (i, t) in list.iter().enumerate() {
        slides |= sliding(i, t)?;
    }
    Ok(slides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_names_the_layers_it_leaves_unwindowed() {
        let pattern = |s: &str| s.chars().map(|c| c == 's').collect::<Vec<bool>>();
        assert_eq!(period(&pattern("sssfsssf")), Some(Some(4)));
        assert_eq!(period(&pattern("sssfss")), Some(Some(4)));
        assert_eq!(period(&pattern("sfsfs")), Some(Some(2)));
        assert_eq!(period(&pattern("ssss")), Some(None));
        assert_eq!(period(&pattern("fff")), Some(Some(1)));
        // Qwen's layout: the first layers full, the rest windowed.
        assert_eq!(period(&pattern("ffss")), None);
        assert_eq!(period(&pattern("sssfssfs")), None);
    }
}
