// LR schedules with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py).
#include <algorithm>
#include <cmath>

#include "zerorun/error.h"
#include "zerorun/optim.h"

namespace zerorun {

namespace {
constexpr double kPi = 3.14159265358979323846;  // M_PI's value (M_PI is POSIX, not standard C++)
}  // namespace

LrSchedule::LrSchedule(const SchedulerConfig& s, const OptimizerConfig& o, int64_t total_steps)
    : type_(s.type), base_lr_(o.lr), p_(s.params) {
  // "auto" values (resolve_config fills them for a run; these are for library callers): max lr = optimizer lr,
  // total = the run's steps, others their defaults.
  for (auto& [k, v] : p_.items()) {
    if (v != "auto") continue;
    if (k == "warmup_max_lr" || k == "cycle_max_lr")
      v = base_lr_;
    else if (k == "total_num_steps")
      v = total_steps;
    else if (k == "warmup_num_steps")
      v = 0;
    else
      v = nullptr;
  }
  last_batch_iteration_ = static_cast<int64_t>(get("last_batch_iteration", -1));
  if ((type_ == "WarmupDecayLR" || type_ == "WarmupCosineLR") && !p_.contains("total_num_steps"))
    ZR_FAIL("scheduler ", type_, " needs 'scheduler.params.total_num_steps'");
  // DeepSpeed's OneCycle cycles momentum only for optimizers with betas (not torch's SGD).
  cycle_momentum_ = type_ == "OneCycle" && o.type != "SGD" && p_.value("cycle_momentum", true);
}

double LrSchedule::get(const char* k, double def) const {
  if (!p_.contains(k) || p_[k].is_null()) return def;
  return p_[k].get<double>();
}

LrMom LrSchedule::at(int64_t it) const {
  if (it >= 0) return at_iteration(it + last_batch_iteration_ + 1);
  // The first optimizer step runs before the scheduler's first step(), with what its constructor left in the
  // optimizer: with last_batch_iteration -1 the schedule's start (get_lr() at -1; OneCycle also sets
  // betas to (cycle_min_mom, 0.99)); with any other value the constructor leaves the optimizer's own lr and betas.
  if (last_batch_iteration_ != -1 || type_.empty()) return {base_lr_, std::nullopt};
  LrMom r = at_iteration(-1);
  if (cycle_momentum_) r.beta1 = get("cycle_min_mom", 0.8);
  return r;
}

// DeepSpeed 0.19.5's get_lr() (deepspeed/runtime/lr_schedules.py) with last_batch_iteration = it.
LrMom LrSchedule::at_iteration(int64_t it) const {
  const double step = static_cast<double>(it);
  const bool linear = p_.value("warmup_type", std::string("log")) == "linear";  // anything else: log, as DeepSpeed
  // WarmupLR._get_gamma's warmup part (warmup_num_steps at least 2).
  auto warm_gamma = [&](double n_warm) { return linear ? step / n_warm : std::log(step + 1.0) / std::log(n_warm); };
  if (type_.empty()) return {base_lr_, std::nullopt};
  if (type_ == "WarmupLR" || type_ == "WarmupDecayLR") {
    // WarmupLR's warmup_max_lr defaults to the optimizer's lr; WarmupDecayLR's signature keeps 0.001.
    const double mn = get("warmup_min_lr", 0.0), mx = get("warmup_max_lr", type_ == "WarmupLR" ? base_lr_ : 0.001);
    const double nw = std::max(2.0, get("warmup_num_steps", 1000));
    if (it < 0) return {mn, std::nullopt};  // "before it has started": min_lrs
    double gamma = 1.0;
    if (step < nw) {
      gamma = warm_gamma(nw);
    } else if (type_ == "WarmupDecayLR") {
      const double total = get("total_num_steps", 0);
      gamma = std::max(0.0, (total - step) / std::max(1.0, total - nw));
    }
    return {mn + (mx - mn) * gamma, std::nullopt};
  }
  if (type_ == "WarmupCosineLR") {
    const double nw = std::max(2.0, get("warmup_num_steps", 1000));
    const double total = get("total_num_steps", 0), wmin = get("warmup_min_ratio", 0.0),
                 cmin = get("cos_min_ratio", 0.0001);
    if (it < 0) return {0.0, std::nullopt};  // get_lr() before the start: 0
    double ratio;
    if (step < nw) {
      ratio = wmin + warm_gamma(nw) * (1.0 - wmin);
    } else {
      // The cosine progress is clamped to 1: after total_num_steps (and when total <= warmup) the ratio stays at
      // cos_min_ratio.
      const double real_last = step - nw + 1, real_total = std::max(1.0, total - nw);
      const double progress = std::min(1.0, real_last / real_total);
      ratio = std::max(0.0, cmin + (1.0 - cmin) * (1.0 + std::cos(kPi * progress)) / 2.0);
    }
    return {base_lr_ * ratio, std::nullopt};
  }
  if (type_ == "OneCycle") {
    const double mn = get("cycle_min_lr", 0.0), mx = get("cycle_max_lr", base_lr_);
    const double first = get("cycle_first_step_size", 2000), second = get("cycle_second_step_size", first);
    const double total = first + second, ratio = first / total;
    const double stairs1 = get("cycle_first_stair_count", 0), stairs2 = get("cycle_second_stair_count", stairs1);
    const double mmin = get("cycle_min_mom", 0.8), mmax = get("cycle_max_mom", 0.9);
    if (step < total) {
      const double bi = step + 1;
      const double cycle = std::floor(1 + bi / total);
      const double x = 1.0 + bi / total - cycle;
      double sf;
      double stairs;
      if (x <= ratio) {
        sf = x / ratio;
        stairs = stairs1;
      } else {
        sf = (x - 1) / (ratio - 1);
        stairs = stairs2;
      }
      if (stairs > 0) {  // lr/mom held flat over each of `stairs` stairs of the half cycle, from the integer offset
        const double ci = std::fmod(bi, total);
        const double pos = ci <= first ? ci * stairs / first : (total - ci) * stairs / second;
        sf = std::floor(pos) / stairs;
      }
      LrMom r{mn + (mx - mn) * sf, std::nullopt};
      if (cycle_momentum_) r.beta1 = mmax - (mmax - mmin) * sf;
      return r;
    }
    // Decay after the cycle: interval = (it - total + 1) / decay_step_size, not floored; a decay_step_size or rate
    // of 0 keeps cycle_min_lr (and cycle_max_mom).
    const double dss = get("decay_step_size", 0), rate = get("decay_lr_rate", 0), mrate = get("decay_mom_rate", 0);
    const double interval = dss != 0 ? (step - total + 1) / dss : 0.0;
    LrMom r{rate != 0 ? mn / (1 + rate * interval) : mn, std::nullopt};
    if (cycle_momentum_) r.beta1 = mrate != 0 ? mmax * (1 + mrate * interval) : mmax;
    return r;
  }
  if (type_ == "LRRangeTest") {
    const double mn = get("lr_range_test_min_lr", 1e-3), ss = get("lr_range_test_step_size", 2000),
                 rate = get("lr_range_test_step_rate", 1.0);
    const bool stair = p_.value("lr_range_test_staircase", false);
    const double interval = stair ? std::floor((step + 1) / ss) : (step + 1) / ss;
    return {mn * (1 + rate * interval), std::nullopt};
  }
  ZR_FAIL("unknown scheduler type '", type_, "'");
}

LossScaler::LossScaler(const LossScaleConfig& c, bool enabled) {
  if (!enabled) return;
  if (c.loss_scale > 0) {
    scale_ = c.loss_scale;
    return;
  }
  dynamic_ = true;
  scale_ = std::ldexp(1.0, c.initial_scale_power);
  min_scale_ = c.min_loss_scale;
  window_ = c.loss_scale_window;
  delayed_shift_ = cur_hysteresis_ = c.hysteresis;
  consecutive_ = c.consecutive_hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) return;
  if (overflow) {
    if (delayed_shift_ == 1 || cur_hysteresis_ == 1) {
      if (scale_ <= min_scale_)
        ZR_FAIL("Current loss scale already at minimum (", min_scale_,
                ") - cannot decrease scale anymore. Gradients overflow at every step; exiting run.");
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (consecutive_) cur_hysteresis_ = delayed_shift_;
    if ((cur_iter_ - last_overflow_iter_) % window_ == 0) {
      if (!consecutive_) cur_hysteresis_ = delayed_shift_;
      scale_ *= 2.0;
    }
  }
  ++cur_iter_;
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"cur_hysteresis", cur_hysteresis_}};
}

void LossScaler::load_state(const nlohmann::json& j) {
  auto num = [&](const char* k) {
    ZR_CHECK(j.is_object() && j.contains(k) && j[k].is_number(), "loss_scaler: '", k, "' must be a number");
    return j[k].get<double>();
  };
  auto whole = [&](const char* k) {
    ZR_CHECK(j.is_object() && j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() >= -1 &&
                 j[k].get<int64_t>() <= (int64_t{1} << 50),
             "loss_scaler: '", k, "' must be an integer >= -1");
    return j[k].get<int64_t>();
  };
  const double scale = num("scale");
  ZR_CHECK(std::isfinite(scale) && scale > 0, "loss_scaler: 'scale' must be positive and finite, got ", scale);
  scale_ = scale;
  cur_iter_ = whole("cur_iter");
  last_overflow_iter_ = whole("last_overflow_iter");
  cur_hysteresis_ = static_cast<int>(std::min<int64_t>(whole("cur_hysteresis"), 1 << 30));
}

}  // namespace zerorun
