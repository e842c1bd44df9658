// Using zerorun as a library, like deepspeed.initialize: build a model in
// code, parse a config, and drive the engine step by step.
#include <cstdio>

#include "zerorun/engine.h"

using namespace zerorun;

int main() {
  MlpSpec spec;
  spec.in = 64;
  spec.hidden = 128;
  spec.out = 64;
  Model model = build_mlp(spec, /*seed=*/7);
  Config cfg = parse_config(json::parse(R"({"train_batch_size": 16,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "gradient_clipping": 1.0})"),
                            "<inline config>");
  auto comm = make_self_comm();
  ResolveContext rc;
  rc.world_size = comm->size();
  resolve_config(cfg, rc);
  Engine engine(model, cfg, *comm, /*total_steps=*/50);
  auto data = make_data_source("synthetic", model, 0, /*seed=*/1);
  for (int s = 0; s < 50; ++s) {
    StepStats st = engine.train_step(*data);
    if (st.step % 10 == 0) std::printf("step %lld loss %.6f\n", static_cast<long long>(st.step), st.loss);
  }
  return 0;
}
