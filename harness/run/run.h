// The run of one trace against one engine (harness/run/run.cpp: the loop;
// harness/run/schedule.cpp: what is read when). Internal to the harness:
// kvcheck::execute (kvcheck/executor.h) is how it is used.
#pragma once

#include "kvcheck/executor.h"
#include "run/readings.h"
#include "run/transitions.h"
#include "run/verdicts.h"

#include <memory>
#include <string>
#include <vector>

namespace kvcheck {

// The ids and handles an operation names (never h0), from its fields.
struct Named {
    std::vector<std::string> ids;
    std::vector<std::int64_t> handles;
};

class Run final : public checkers::Probe {
  public:
    Run(Engine& engine, const RunOptions& options);

    RunResult run(const Trace& trace);

    // ---- the probe checkers read through ----
    Engine& engine() override { return engine_; }
    Auditor& auditor() override { return audit_; }
    const Capabilities& capabilities() const override { return capabilities_; }
    std::size_t step() const override { return verdicts_.step(); }
    bool checking(Property property) const override { return verdicts_.checking(property); }
    void fail(Property property, std::string message) override { verdicts_.fail(property, message); }
    void engine_error(std::string message) override { verdicts_.engine_error(message); }
    const checkers::HandleReading& handle(std::int64_t handle) override { return readings_.handle(handle); }
    bool owned(std::int64_t handle) override { return readings_.handle_owned(handle); }
    std::string handle_difference(std::int64_t handle, ObjectId expected) override {
        return readings_.handle_difference(handle, expected);
    }
    std::string entry_difference(const checkers::EntryFact& entry) override {
        return readings_.entry_difference(entry.id, entry.reading, entry.expected);
    }
    bool entry_owned(const checkers::EntryFact& entry) override { return readings_.entry_owned(entry.id, entry.reading); }
    std::optional<std::string> aliased_entry(const checkers::HandleFact& handle) override {
        return readings_.aliased_entry(handle);
    }
    std::optional<std::int64_t> handle_sharing(const checkers::HandleFact& handle) override {
        return readings_.handle_sharing(handle);
    }
    std::optional<std::string> entry_sharing(const checkers::EntryFact& entry) override {
        return readings_.entry_sharing(entry.id, entry.reading, entry.expected);
    }
    const std::vector<std::string>& listed() override { return readings_.listed(); }
    std::string store_difference() override { return readings_.store_difference(false); }

  private:
    void run_step(const Op& operation);
    void deliver(const Fact& fact);
    void check_before(const Op& operation, const Named& named);
    void tell_reads(const Op& operation, const std::vector<std::string>& entries);
    void check_after(const Op& operation, const Named& named, std::vector<std::string> reached);
    void check_everything(const std::string& note);
    void read_every_entry();
    std::vector<std::string> check_entries(const std::vector<std::string>& ids);
    void check_handles(std::vector<std::int64_t> handles, bool full_read);
    void check_listing(bool full_read);
    void recheck_everything(std::size_t last_step);
    void record_state(const Op& op);
    std::string handle_answer(std::int64_t handle);
    std::string answer_of(const Op& operation, const Fact& fact, const std::vector<CopyRecord>* copies);

    // Is any checker that reads `what` still checking at this step?
    template <typename Member>
    bool still_reading(Member what) const {
        for (std::size_t i = 0; i < checkers_.size(); ++i) {
            if (checker_reads_[i].*what && verdicts_.checking(checkers_[i]->property())) return true;
        }
        return false;
    }

    Engine& engine_;
    const RunOptions& options_;
    Capabilities capabilities_;
    Verdicts verdicts_;
    std::vector<std::unique_ptr<checkers::Checker>> checkers_;  // of the checked properties
    std::vector<checkers::Reads> checker_reads_;                // what each reads
    checkers::Reads reads_;                                     // what they read, together
    Auditor audit_;
    RunResult result_;
    Readings readings_;
    DumpSlots slots_;
    Transitions transitions_;
    bool every_step_ = false;   // a full read after every step (RunOptions, or no storage identities)
    bool reads_store_ = false;  // some checked property reads the store's entries or listing
    bool rechecking_ = false;   // the final read, without versions, is running
    bool listing_due_ = false;  // the store's membership changed since its listing was compared
    bool derives_owned_ = false;   // owned-marker is checked on an engine without a marker
    bool round_after_op_ = false;  // a round began after this step's operation (for the derived marker)
    std::size_t steps_since_full_read_ = 0;
    const Op* next_ = nullptr;  // the step after the running one (nullptr: it is the last)
    std::string answer_;        // what the engine answered at the running step (RunOptions::record_answers)
};

}  // namespace kvcheck
