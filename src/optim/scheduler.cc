// LR schedules with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py).
#include <algorithm>
#include <cmath>

#include "zerorun/error.h"
#include "zerorun/optim.h"

namespace zerorun {

LrSchedule::LrSchedule(const SchedulerConfig& s, const OptimizerConfig& o, int64_t total_steps)
    : type_(s.type), base_lr_(o.lr), base_beta1_(o.type == "SGD" ? o.momentum : o.beta1), p_(s.params) {
  // "auto" values: max lr = optimizer lr, total = the run's steps, others their defaults.
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
  offset_ = static_cast<int64_t>(get("last_batch_iteration", -1)) + 1;
  if ((type_ == "WarmupDecayLR" || type_ == "WarmupCosineLR") && !p_.contains("total_num_steps"))
    ZR_FAIL("scheduler ", type_, " needs 'scheduler.params.total_num_steps'");
  if (type_ == "WarmupCosineLR") {  // total "auto" = the run's steps: checked here (a number: in the config too)
    const double total = get("total_num_steps", 0), warm = std::max(2.0, get("warmup_num_steps", 1000));
    ZR_CHECK(total != warm, "scheduler WarmupCosineLR: total_num_steps (", total, ") equals warmup_num_steps (", warm,
             "): the cosine phase would divide by zero steps; train for more steps (total_num_steps \"auto\" is the "
             "run's --steps) or lower scheduler.params.warmup_num_steps");
  }
}

double LrSchedule::get(const char* k, double def) const {
  if (!p_.contains(k) || p_[k].is_null()) return def;
  return p_[k].get<double>();
}

LrMom LrSchedule::at_iteration(int64_t it) const {
  const double step = static_cast<double>(it);
  auto warm_gamma = [&](double n_warm) {
    n_warm = std::max(2.0, n_warm);
    if (step < 0) return 0.0;  // before the first scheduler step: the warmup start
    bool lin = p_.value("warmup_type", std::string("log")) == "linear";
    if (step < n_warm) return lin ? step / n_warm : std::log(step + 1.0) / std::log(n_warm);
    return 1.0;
  };
  if (type_.empty()) return {base_lr_, std::nullopt};
  if (type_ == "WarmupLR" || type_ == "WarmupDecayLR") {
    double mn = get("warmup_min_lr", 0.0), mx = get("warmup_max_lr", 0.001);
    double nw = std::max(2.0, get("warmup_num_steps", 1000));
    double gamma = warm_gamma(nw);
    if (type_ == "WarmupDecayLR" && step >= nw) {
      double total = get("total_num_steps", 0);
      gamma = std::max(0.0, (total - step) / std::max(1.0, total - nw));
    }
    return {mn + (mx - mn) * gamma, std::nullopt};
  }
  if (type_ == "WarmupCosineLR") {
    double nw = std::max(2.0, get("warmup_num_steps", 1000));
    double total = get("total_num_steps", 0), wmin = get("warmup_min_ratio", 0.0), cmin = get("cos_min_ratio", 0.0001);
    double ratio;
    if (step < nw) {
      ratio = wmin + warm_gamma(nw) * (1.0 - wmin);
    } else {
      double real_last = step - nw + 1, real_total = total - nw;
      double r = (1.0 + std::cos(M_PI * real_last / real_total)) / 2.0;
      ratio = std::max(0.0, cmin + (1.0 - cmin) * r);
    }
    return {base_lr_ * ratio, std::nullopt};
  }
  if (type_ == "OneCycle") {
    double mn = get("cycle_min_lr", 0.0), mx = get("cycle_max_lr", base_lr_);
    double first = get("cycle_first_step_size", 2000), second = get("cycle_second_step_size", first);
    double total = first + second, ratio = first / total;
    bool cyc_mom = p_.value("cycle_momentum", true);
    double mmin = get("cycle_min_mom", 0.8), mmax = get("cycle_max_mom", 0.9);
    if (step < total) {
      double bi = step + 1;
      double cycle = std::floor(1 + bi / total);
      double x = 1.0 + bi / total - cycle;
      double sf = x <= ratio ? x / ratio : (x - 1) / (ratio - 1);
      LrMom r{mn + (mx - mn) * sf, std::nullopt};
      if (cyc_mom) r.beta1 = mmax - (mmax - mmin) * sf;
      return r;
    }
    double dss = get("decay_step_size", 0), rate = get("decay_lr_rate", 0), mrate = get("decay_mom_rate", 0);
    double interval = dss > 0 ? (step - total + 1) / dss : 0.0;
    LrMom r{mn / (1 + rate * interval), std::nullopt};
    if (cyc_mom) r.beta1 = mmax * (1 + mrate * interval);
    return r;
  }
  if (type_ == "LRRangeTest") {
    double mn = get("lr_range_test_min_lr", 1e-3), ss = get("lr_range_test_step_size", 2000),
           rate = get("lr_range_test_step_rate", 1.0);
    bool stair = p_.value("lr_range_test_staircase", false);
    double interval = stair ? std::floor((step + 1) / ss) : (step + 1) / ss;
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
