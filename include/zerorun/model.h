// model.bin: a safetensors file whose metadata carries the graph JSON.
// Loading validates the container and the graph against the tensors;
// builders create fresh models for the known architectures.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zerorun/graph.h"

namespace zerorun {

struct SafetensorsFile;

struct Model {
  Graph graph;
  std::vector<std::string> tensor_names;   // in graph first-use order
  std::map<std::string, Tensor> tensors;   // f32 copies in memory (builders, import, load_model); empty when opened
  std::map<std::string, Shape> shapes;     // every parameter's shape (finalize_model fills it)
  std::map<std::string, int64_t> symbols;  // default bindings of input symbols (e.g. T)
  std::string graph_hash;                  // crc32 of the canonical graph JSON, hex
  // open_model: the model.bin the weights are read from, range by range (read_f32), never all at once.
  std::shared_ptr<const SafetensorsFile> file;
  DType dtype = DType::F32;  // what save_model writes: f32, bf16 or f16 (init --dtype; import: the checkpoint's)
  int64_t num_params() const;
  std::map<std::string, Shape> param_shapes() const { return shapes; }
  const Shape& shape(const std::string& name) const;
  int64_t numel(const std::string& name) const { return shape_numel(shape(name)); }
  // Elements [first, first + count) of a parameter as f32, from memory or from the opened file (16-bit weights
  // widened); a NaN or Inf is an error naming the file, the tensor and the element.
  void read_f32(const std::string& name, int64_t first, int64_t count, float* dst) const;
};

// The whole model in memory as f32 (tools and tests; training opens it instead).
Model load_model(const std::string& path);
// The header and graph only: shapes known, weights read on demand by Model::read_f32 (each rank reads the
// ranges it owns, so no rank holds the whole model).
Model open_model(const std::string& path);
// Training FLOPs per token (or per sample for models without tokens): 6 x parameters, plus 6·L·C·T attention for
// the gpt2 and llama architectures (src/model/flops.cc).
double train_flops_per_token(const Model& m, int64_t T);
// The model's hidden width (its architecture record's n_embd / hidden_size, else the smaller side of its widest
// matrix): what DeepSpeed's "auto" bucket sizes are computed from.
int64_t model_hidden(const Model& m);
// Writes the weights in m.dtype (f32, bf16 or f16; rounded to nearest even); an opened model is copied tensor by
// tensor. A value the dtype cannot hold (f16 past 65504) is an error naming the tensor.
void save_model(const std::string& path, const Model& m);
// Fills symbols/graph_hash/tensor_names from graph+tensors and validates.
void finalize_model(Model& m);
// The pieces of finalize_model, also for graphs that come without tensors (a checkpoint manifest's):
// the graph's "symbols" metadata (positive integers), its hash (what model.bin and checkpoints carry), and its
// validation against parameter shapes (B = 1; every parameter used), returning the parameters in first-use order.
std::map<std::string, int64_t> graph_symbols(const Graph& g);
std::string graph_hash(const Graph& g);
std::vector<std::string> check_graph_params(const Graph& g, const std::map<std::string, Shape>& param_shapes);

struct MlpSpec {
  int64_t in = 512, hidden = 1024, out = 512, layers = 1;  // hidden layers
  std::string act = "relu";
};
struct Gpt2Spec {
  int64_t vocab = 50257, n_ctx = 1024, n_embd = 768, n_layer = 12, n_head = 12;
  bool tied = true;
  // config.json's dropouts, applied in training: attention probabilities, the attention and MLP outputs before
  // their residual adds, the embeddings' sum.
  double attn_pdrop = 0.0, resid_pdrop = 0.0, embd_pdrop = 0.0;
};
// A decoder-only transformer as transformers' causal-LM classes compute it, by default LlamaForCausalLM: RMSNorm,
// rotary positions (rope_theta), grouped-query attention with n_kv_head key/value heads (0: n_head), SwiGLU MLP of
// width ffn, no biases, lm_head tied to the embedding or not. The other fields compose today's model_types from
// features (src/model/hf_arch.cc maps each config.json onto them): Qwen2's q/k/v biases, Qwen3's per-head q/k
// RMSNorm and decoupled head size, Mistral's sliding window, OLMo-2's norms after attention and MLP with q/k norms
// over the full width, Gemma's (1 + w) norms, embedding scale, GeGLU, sandwich norms, soft-capping, attention scale
// and per-layer sliding windows and rotary bases.
struct LlamaSpec {
  int64_t vocab = 32000, n_ctx = 2048, n_embd = 512, n_layer = 8, n_head = 8, ffn = 1376;
  int64_t n_kv_head = 0;
  double rope_theta = 10000.0, rms_eps = 1e-6;
  bool tied = false;
  std::string model_type = "llama";  // transformers' model_type the graph is saved as
  int64_t head_dim = 0;              // 0: n_embd / n_head
  json rope_scaling;                 // null, or transformers' rope parameters {"rope_type", "factor", ...}
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  std::string qk_norm;             // "" none, "head" (per head, [head_dim] weights), "full" ([H D] and [K D] weights)
  std::string norm_place = "pre";  // "pre" (Llama), "post" (OLMo-2: after attention / MLP), "sandwich" (Gemma 2/3)
  double norm_offset = 0.0;        // 1: Gemma's RMSNorm scales by 1 + w
  std::string act = "silu";        // "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
  double embed_scale = 0.0;        // > 0: embeddings times this (Gemma: sqrt(hidden))
  double attn_scale = 0.0;         // > 0: q.k scale (Gemma: query_pre_attn_scalar^-1/2); 0: head_dim^-1/2
  double attn_softcap = 0.0, final_softcap = 0.0;  // Gemma 2's soft-capping of attention scores and logits
  int64_t window = 0;                              // > 0: sliding-window attention of this many keys
  std::vector<bool> sliding;      // per layer: whether it uses the window (empty: every layer, when window > 0)
  double local_rope_theta = 0.0;  // > 0: the rope base of sliding layers (Gemma 3), unscaled
  int64_t padding_idx = -1;       // >= 0: config.pad_token_id, whose embedding row the lookup gives no gradient
  double attn_dropout = 0.0;      // training dropout of the attention probabilities (attention_dropout)
  double resid_dropout = 0.0;     // of the attention and MLP outputs before their residual adds (Phi-3's resid_pdrop)
  json hf_config;                 // the imported config.json (merge writes it back with what training changed)
  int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
};
// shapes_only: the graph and the parameters' shapes, no weights (zerorun estimate of a model of any size).
Model build_mlp(const MlpSpec& s, uint64_t seed, bool shapes_only = false);
Model build_gpt2(const Gpt2Spec& s, uint64_t seed, bool shapes_only = false);
// A transformers GPT-2 checkpoint directory (config.json + model.safetensors or its sharded index) as a zerorun
// gpt2 model (src/model/hf_import.cc); `notes` receives what was left out (tensors that are not weights).
Model import_hf_gpt2(const std::string& dir, std::vector<std::string>* notes = nullptr, bool no_dropout = false);
Model build_llama(const LlamaSpec& s, uint64_t seed, bool shapes_only = false);
// A transformers Llama checkpoint directory (model_type "llama") as a zerorun llama model: "model." names dropped,
// q_proj/k_proj/v_proj stacked into self_attn.qkv_proj; unsupported config (rope_scaling, biases, head_dim other
// than hidden_size / num_attention_heads, activation) is an error naming the key.
Model import_hf_llama(const std::string& dir, std::vector<std::string>* notes = nullptr, bool no_dropout = false);
// A transformers checkpoint directory of any architecture of hf_arch.h or gpt2, by config.json's model_type.
// Dropout above 0 in its config is an error unless no_dropout (the user's --no_dropout: trains without it).
Model import_hf(const std::string& dir, std::vector<std::string>* notes = nullptr, bool no_dropout = false);
// Whether a zerorun llama graph is the transformers-compatible one (rotary positions, no learned position table;
// models written before rotary embeddings existed are not).
bool llama_is_hf_compatible(const Graph& g);

}  // namespace zerorun
