#include "tools/synth.h"

#include <random>

#include "allocator/pool.h"
#include "tools/row_sink.h"
#include "tools/sim_device.h"

namespace cudapool::tools {

namespace {

constexpr StreamId kMain = 0x7;  // the training stream
constexpr StreamId kSide = 0x9;  // the data loader's copy stream

class Workload {
 public:
  Workload(DevicePool& pool, SimFences& fences, std::int64_t* now) : pool_(pool), fences_(fences), now_(now) {}

  void* alloc(std::size_t bytes, StreamId s = kMain) {
    tick(2000);
    AllocResult r = pool_.allocate(bytes, s);
    if (r.status != AllocStatus::ok) ++failures_;
    return r.ptr;
  }
  void release(void* p, StreamId s = kMain) {
    if (!p) return;
    tick(1000);
    pool_.free_on_stream(p, s);
  }
  // Simulated GPU time between calls.
  void compute(std::int64_t ns) { *now_ += ns; }
  int failures() const { return failures_; }

 private:
  void tick(std::int64_t ns) {
    *now_ += ns;
    fences_.advance(++index_, *now_);  // exactly as the replay advances its fences
  }
  DevicePool& pool_;
  SimFences& fences_;
  std::int64_t* now_;
  std::uint64_t index_ = 0;
  int failures_ = 0;
};

// The model `train` runs: its layers and width, and the fixed sizes around them.
struct TrainShape {
  int layers;
  std::size_t d;
  std::size_t vocab = 32000, batch = 4, heads = 16;
};

// The weights' bytes in fp16: the embedding, then per layer qkv, proj, mlp up/down and two norms.
std::vector<std::size_t> train_weights(const TrainShape& m) {
  const std::size_t d = m.d;
  std::vector<std::size_t> weights;
  weights.push_back(m.vocab * d * 2);  // embedding
  for (int l = 0; l < m.layers; ++l)
    for (std::size_t elems : {3 * d * d, d * d, 4 * d * d, 4 * d * d, d, d}) weights.push_back(elems * 2);
  return weights;
}

// The forward pass over the layers of a step of sequence length s: the activations saved for
// the backward pass.
std::vector<void*> train_forward(Workload& w, const TrainShape& m, std::size_t s, std::size_t tokens) {
  const std::size_t d = m.d;
  std::vector<void*> saved;
  for (int l = 0; l < m.layers; ++l) {
    saved.push_back(w.alloc(tokens * d * 2));               // layernorm out
    saved.push_back(w.alloc(tokens * 3 * d * 2));           // qkv
    void* scores = w.alloc(m.batch * m.heads * s * s * 2);  // attention scores: temporary
    w.compute(10 * 200000);
    saved.push_back(w.alloc(tokens * d * 2));  // attention out
    w.release(scores);
    saved.push_back(w.alloc(tokens * 4 * d * 2));  // mlp up (saved for gelu backward)
    void* act = w.alloc(tokens * 4 * d * 2);
    w.compute(10 * 300000);
    saved.push_back(act);
  }
  return saved;
}

// The logits and the loss; the embedding's gradient into grads[0].
void train_loss(Workload& w, const TrainShape& m, std::size_t tokens, const std::vector<std::size_t>& weights,
                std::vector<void*>* grads) {
  void* logits = w.alloc(tokens * m.vocab * 2);
  void* loss_tmp = w.alloc(tokens * m.vocab * 4);  // fp32 softmax for the loss
  w.compute(10 * 500000);
  w.release(loss_tmp);
  void* dlogits = w.alloc(tokens * m.vocab * 2);
  w.release(logits);
  (*grads)[0] = w.alloc(weights[0]);
  w.release(dlogits);
}

// The backward pass, last layer first: each weight's gradient, the saved activations released.
void train_backward(Workload& w, const TrainShape& m, std::size_t tokens, const std::vector<std::size_t>& weights,
                    std::vector<void*>* saved, std::vector<void*>* grads) {
  void* dh = w.alloc(tokens * m.d * 2);
  for (int l = m.layers - 1; l >= 0; --l) {
    for (int k = 5; k >= 0; --k) {
      std::size_t idx = 1 + static_cast<std::size_t>(l) * 6 + static_cast<std::size_t>(k);
      void* tmp = w.alloc(tokens * (k >= 2 && k < 4 ? 4 : 1) * m.d * 2);
      (*grads)[idx] = w.alloc(weights[idx]);
      w.compute(10 * 150000);
      w.release(tmp);
    }
    for (int k = 0; k < 5; ++k) {
      w.release(saved->back());
      saved->pop_back();
    }
  }
  w.release(dh);
}

// The optimizer step: Adam state (fp32 master weights, m, v) appears at the first step and stays;
// foreach-style fused update temporaries; then zero_grad(set_to_none=True).
void train_optimizer(Workload& w, const std::vector<std::size_t>& weights, bool first_step, std::vector<void*>* state,
                     std::vector<void*>* grads) {
  if (first_step)
    for (auto b : weights) {
      state->push_back(w.alloc(b * 2));
      state->push_back(w.alloc(b * 2));
      state->push_back(w.alloc(b * 2));
    }
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] < 1024 * 1024) continue;
    void* tmp = w.alloc(weights[i] * 2);
    w.release(tmp);
  }
  w.compute(10 * 1000000);
  for (void*& g : *grads) {
    w.release(g);
    g = nullptr;
  }
}

// GPT-style training: layers × (qkv, proj, mlp up/down) weights in fp16, fp32 master weights and
// Adam state, variable sequence length per step.
void train(Workload& w, std::mt19937_64& rng, int steps, int layers, std::size_t d) {
  const TrainShape m{layers, d};
  const std::vector<std::size_t> weights = train_weights(m);
  std::vector<void*> params, state;
  for (auto b : weights) params.push_back(w.alloc(b));
  std::uniform_int_distribution<int> seq_pick(4, 16);  // × 128 tokens
  for (int step = 0; step < steps; ++step) {
    std::size_t s = 128 * static_cast<std::size_t>(seq_pick(rng)), tokens = m.batch * s;
    // The loader copies the batch on its own stream; the training stream gets its own copy.
    void* staged = w.alloc(tokens * 8, kSide);
    void* ids = w.alloc(tokens * 8);
    w.release(staged, kSide);
    void* h = w.alloc(tokens * d * 2);
    std::vector<void*> saved = train_forward(w, m, s, tokens);
    std::vector<void*> grads(weights.size(), nullptr);
    train_loss(w, m, tokens, weights, &grads);
    train_backward(w, m, tokens, weights, &saved, &grads);
    w.release(h);
    w.release(ids);
    train_optimizer(w, weights, step == 0, &state, &grads);
  }
}

// LLM serving with continuous batching: each request's KV cache grows by reallocation (new
// buffer 1.5× larger, copy, free the old one); requests finish at random lengths.
void serve(Workload& w, std::mt19937_64& rng, int steps, int layers, std::size_t d) {
  struct Request {
    void* kv;
    std::size_t capacity, tokens, target;
  };
  const std::size_t per_token = static_cast<std::size_t>(layers) * 2 * d * 2;  // K and V, fp16
  std::uniform_int_distribution<std::size_t> prompt(64, 1536), gen(16, 384);
  std::vector<Request> active;
  for (int step = 0; step < steps; ++step) {
    while (active.size() < 12) {  // admit new requests
      std::size_t p = prompt(rng);
      std::size_t cap = p + 64;
      active.push_back({w.alloc(cap * per_token), cap, p, p + gen(rng)});
      void* prefill = w.alloc(p * d * 4 * 2);  // prefill activations
      w.compute(10 * 400000);
      w.release(prefill);
    }
    void* batch_act = w.alloc(active.size() * d * 8);  // one decode step for the batch
    void* logits = w.alloc(active.size() * 32000 * 2);
    w.compute(10 * 300000);
    w.release(logits);
    w.release(batch_act);
    for (auto& r : active) {
      r.tokens += 8;  // 8 decode steps per simulated step
      if (r.tokens > r.capacity) {
        std::size_t cap = r.capacity * 3 / 2;
        void* bigger = w.alloc(cap * per_token);
        w.release(r.kv);
        r.kv = bigger;
        r.capacity = cap;
      }
    }
    for (std::size_t i = 0; i < active.size();) {
      if (active[i].tokens >= active[i].target) {
        w.release(active[i].kv);
        active[i] = active.back();
        active.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (auto& r : active) w.release(r.kv);
}

}  // namespace

bool synthesize_trace(const SynthOptions& o, const PoolOptions& pool_options, SynthResult* out, std::string* error) {
  if (o.pattern != "train" && o.pattern != "serve") {
    *error = "unknown pattern '" + o.pattern + "' (train, serve)";
    return false;
  }
  out->rows.clear();
  std::int64_t now = 1'764'000'000'000'000'000;  // a fixed date, so the files are reproducible
  TraceRow dev;
  dev.thread = 1;
  dev.time_ns = now;
  dev.action = TraceAction::device;
  dev.size = o.device_memory;
  dev.requested = o.device_memory;
  dev.detail = TraceDetail::device_facts;  // the text: device_facts_text(kSimGranularity)
  out->rows.push_back(dev);
  SimUpstream upstream(o.device_memory, kSimGranularity);
  SimFences fences;
  RowSink sink(&out->rows, &now);
  TraceClock clock(&now);
  DevicePool pool(0, pool_options, upstream, fences, &sink);
  Workload w(pool, fences, &now);
  std::mt19937_64 rng(o.seed);
  if (o.pattern == "train")
    train(w, rng, o.steps, o.layers, o.hidden);
  else
    serve(w, rng, o.steps, o.layers, o.hidden);
  out->failed_allocations = w.failures();
  pool.set_event_sink(nullptr);  // releasing at teardown is not part of the workload
  // The pool measured how long the simulated device took (nanoseconds of host time): noise that
  // would make every regenerated file differ. A simulated device has no such time.
  for (auto& r : out->rows) r.duration_ns = 0;
  return true;
}

}  // namespace cudapool::tools
