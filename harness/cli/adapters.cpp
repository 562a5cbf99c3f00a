#include "adapters.h"

#include "plugin_probe.h"
#include "process_engine.h"
#include "sandbox.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <unistd.h>

namespace kvcheck::cli {
namespace {

// The launchers of the process adapters loaded, by their source (Adapter::source).
std::map<std::string, std::weak_ptr<process::ProcessLauncher>>& launchers() {
    static std::map<std::string, std::weak_ptr<process::ProcessLauncher>> known;
    return known;
}

std::vector<Adapter>& bundled_list() {
    static std::vector<Adapter> list;
    return list;
}

const Adapter* find_bundled(const std::string& name) {
    for (const Adapter& adapter : bundled_list()) {
        if (adapter.name == name) return &adapter;
    }
    return nullptr;
}

bool looks_like_path(const std::string& text) {
    return text.find('/') != std::string::npos || (text.size() > 3 && text.compare(text.size() - 3, 3, ".so") == 0);
}

// ---- engines in another process (docs/protocol.md) ----------------------------

constexpr const char* exec_prefix = "exec:";
constexpr const char* default_python = "/usr/bin/python3";

// The words of a command line as a POSIX shell splits them: blanks
// separate, '...' and "..." quote, a backslash escapes the next character
// (inside "...", only \\, \" and \$). No expansions.
std::vector<std::string> shell_words(const std::string& text) {
    std::vector<std::string> words;
    std::string word;
    bool in_word = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == ' ' || c == '\t' || c == '\n') {
            if (in_word) words.push_back(word);
            word.clear();
            in_word = false;
            continue;
        }
        in_word = true;
        if (c == '\'') {
            const std::size_t end = text.find('\'', i + 1);
            if (end == std::string::npos) throw UsageError("unterminated ' in the adapter command: " + text);
            word += text.substr(i + 1, end - i - 1);
            i = end;
        } else if (c == '"') {
            std::size_t j = i + 1;
            for (; j < text.size() && text[j] != '"'; ++j) {
                if (text[j] == '\\' && j + 1 < text.size() &&
                    (text[j + 1] == '\\' || text[j + 1] == '"' || text[j + 1] == '$')) {
                    ++j;
                }
                word += text[j];
            }
            if (j >= text.size()) throw UsageError("unterminated \" in the adapter command: " + text);
            i = j;
        } else if (c == '\\' && i + 1 < text.size()) {
            word += text[++i];
        } else {
            word += c;
        }
    }
    if (in_word) words.push_back(word);
    return words;
}

bool is_python_script(const std::string& word) {
    return word.size() > 3 && word.compare(word.size() - 3, 3, ".py") == 0;
}

// The interpreter a Python script adapter runs under, and why that one.
struct Interpreter {
    std::string path;
    std::string why;  // "--python", "$VIRTUAL_ENV", ...: said in every hint
};

bool is_executable(const std::string& path) { return !path.empty() && ::access(path.c_str(), X_OK) == 0; }

std::string environment(const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
}

// The script's own interpreter: a first line `#!/path/to/python ...` (not
// `#!/usr/bin/env ...`, which names none: the environment's PATH decides,
// and an active virtual environment is next anyway).
std::string declared_python(const std::string& script) {
    std::ifstream file(script);
    std::string line;
    if (!std::getline(file, line) || line.rfind("#!", 0) != 0) return "";
    const std::vector<std::string> words = shell_words(line.substr(2));
    if (words.empty() || words.front().rfind('/', 0) != 0) return "";
    if (std::filesystem::path(words.front()).filename() == "env") return "";
    return words.front();
}

// The interpreter beside this kvcheck: a kvcheck installed with the SDK
// into a virtual environment or a prefix (pip's bin/, the .deb's
// /usr/bin) runs next to the python that imports that SDK.
std::string python_beside_kvcheck() {
    std::error_code ignored;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ignored);
    if (self.empty()) return "";
    for (const char* name : {"python", "python3"}) {
        const std::string candidate = (self.parent_path() / name).string();
        if (is_executable(candidate)) return candidate;
    }
    return "";
}

// In order: --python; $KVCHECK_PYTHON (its environment form); the
// script's `#!` interpreter; an active virtual environment's python
// ($VIRTUAL_ENV/bin/python); the environment's python the kvcheck wheel's
// console script names ($KVCHECK_SDK_PYTHON), or the python beside this
// kvcheck (where its installed SDK lives); else Debian's /usr/bin/python3.
Interpreter python_of(const AdapterOptions& options, const std::string& script) {
    if (!options.python.empty()) return {options.python, "--python"};
    const std::string chosen = environment("KVCHECK_PYTHON");
    if (!chosen.empty()) return {chosen, "$KVCHECK_PYTHON"};
    const std::string declared = declared_python(script);
    if (!declared.empty()) return {declared, "the #! line of " + script};
    const std::string venv = environment("VIRTUAL_ENV");
    if (!venv.empty() && is_executable(venv + "/bin/python")) return {venv + "/bin/python", "the active virtual environment, $VIRTUAL_ENV"};
    // The kvcheck wheel's console script names the interpreter of the
    // environment it is installed into (python/kvcheck_adapter/_tool.py).
    const std::string wheel = environment("KVCHECK_SDK_PYTHON");
    if (!wheel.empty()) return {wheel, "the environment the kvcheck wheel is installed in ($KVCHECK_SDK_PYTHON)"};
    const std::string beside = python_beside_kvcheck();
    if (!beside.empty()) return {beside, "the python installed beside kvcheck"};
    return {default_python, "the default: no --python, $KVCHECK_PYTHON, #! line or active virtual environment"};
}

// The kvcheck_adapter package this kvcheck was installed into by the
// wheel (site-packages/kvcheck_adapter/_bin/kvcheck: cmake/kvcheckWheel.cmake),
// or "" for any other kvcheck.
std::filesystem::path wheel_package_dir() {
    std::error_code ignored;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ignored);
    const std::filesystem::path package = self.parent_path().parent_path();
    if (self.empty() || self.parent_path().filename() != "_bin" || package.filename() != "kvcheck_adapter") return {};
    return package;
}

// The Python SDK of this kvcheck, for a Python adapter's PYTHONPATH: the
// one installed beside it (<prefix>/share/kvcheck/python,
// cmake/kvcheckPackage.cmake), else the source tree's it was built from;
// "" when neither is there, and for the wheel's kvcheck, whose SDK is the
// environment's own (putting its site-packages on another interpreter's
// path would bring that environment's torch along).
std::string sdk_dir() {
    if (!wheel_package_dir().empty()) return "";
    std::error_code ignored;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ignored);
    const std::filesystem::path installed = self.parent_path().parent_path() / "share" / "kvcheck" / "python";
    if (!self.empty() && std::filesystem::is_directory(installed / "kvcheck_adapter", ignored)) return installed.string();
    return std::filesystem::is_directory(KVCHECK_PYTHON_SDK_DIR, ignored) ? KVCHECK_PYTHON_SDK_DIR : "";
}

// The command an adapter argument names, or nullopt when it names no
// process: "exec:COMMAND" as given; "x.py ARGS" run by the interpreter
// (python_of: `why` says which and why).
std::optional<process::ProcessCommand> process_command(const std::string& text, const AdapterOptions& options,
                                                       std::string& why) {
    process::ProcessCommand command;
    if (text.rfind(exec_prefix, 0) == 0) {
        command.argv = shell_words(text.substr(std::strlen(exec_prefix)));
        if (command.argv.empty()) throw UsageError("exec: needs a command, as in exec:'python3 my_adapter.py'");
    } else {
        std::vector<std::string> words = shell_words(text);
        if (words.empty() || !is_python_script(words.front())) return std::nullopt;
        if (!std::filesystem::exists(words.front())) throw UsageError("adapter script not found: " + words.front());
        const Interpreter python = python_of(options, words.front());
        why = python.why;
        words.insert(words.begin(), python.path);
        command.argv = std::move(words);
    }
    for (const std::string& word : command.argv) command.text += (command.text.empty() ? "" : " ") + shell_quoted(word);
    // The SDK of this kvcheck, importable as kvcheck_adapter.
    const std::string sdk = sdk_dir();
    if (!sdk.empty()) {
        const char* path = std::getenv("PYTHONPATH");
        command.extra_env.push_back("PYTHONPATH=" + sdk + (path != nullptr && *path != '\0' ? ":" + std::string(path) : ""));
    }
    // A thread-safe adapter's schedule follows the run's seed, so that a
    // finding replays (docs/protocol.md section 11a).
    if (options.thread_seed && std::getenv("KVCHECK_THREAD_SEED") == nullptr) {
        command.extra_env.push_back("KVCHECK_THREAD_SEED=" + std::to_string(*options.thread_seed));
    }
    return command;
}

// Every import error of an adapter process names --python: the usual
// cause is an interpreter without the adapter's packages.
std::string start_hint(const std::string& detail, const process::ProcessCommand& command, const std::string& why) {
    const bool import_error = detail.find("No module named") != std::string::npos ||
                              detail.find("ImportError") != std::string::npos;
    if (!import_error) return "";
    const std::string interpreter = why.empty() ? "the adapter's command" : command.argv.front() + " (chosen by " + why + ")";
    std::string hint = "\nhint: " + interpreter + " cannot import what the adapter needs; name an interpreter that can with "
                       "--python PATH (a virtual environment's: --python .venv/bin/python, or activate it), or $KVCHECK_PYTHON";
    if (detail.find("No module named 'kvcheck_adapter'") != std::string::npos) {
        hint += "; the SDK itself: pip install kvcheck's python/ into that interpreter, or put that directory on PYTHONPATH";
    }
    return hint;
}

Adapter load_process_adapter(const process::ProcessCommand& command, const std::string& why) {
    process::LaunchOptions launch;
    launch.on_fault = [](const process::ProcessFault& fault) { exit_with_fault(fault.kind, fault.detail); };
    launch.on_warm_start = [](int pid) { report_adopted_process(pid); };
    // KVCHECK_COLD_START=1: every adapter process runs the command (for
    // comparing, and for adapters whose engine cannot be forked).
    const char* cold = std::getenv("KVCHECK_COLD_START");
    launch.warm_starts = cold == nullptr || *cold == '\0' || std::string(cold) == "0";
    std::shared_ptr<process::ProcessLauncher> launcher;
    process::Hello hello;
    try {
        launcher = std::make_shared<process::ProcessLauncher>(command, launch);
        hello = launcher->probe();
    } catch (const process::ProcessError& error) {
        throw UsageError(error.fault().detail + start_hint(error.fault().detail, command, why));
    }
    launchers()[exec_prefix + command.text] = launcher;
    Adapter adapter{hello.name, hello.description, exec_prefix + command.text, {}, [launcher] { return launcher->make(); },
                    [launcher](int pid) { return launcher->take_output(pid); }, hello.capabilities.model};
    adapter.paged = hello.capabilities.paged;
    adapter.store = hello.capabilities.store;
    adapter.policy = hello.capabilities.policy;
    adapter.dump_kill_absent = hello.dump_fork_absent;
    return adapter;
}

}  // namespace

EngineFactory isolated_factory(const Adapter& adapter) {
    const auto found = launchers().find(adapter.source);
    if (found != launchers().end()) {
        if (const std::shared_ptr<process::ProcessLauncher> launcher = found->second.lock()) {
            return [launcher] { return launcher->make_isolated(); };
        }
    }
    return adapter.make;
}

bool replays_in_child(const Adapter& adapter) {
    const bool process = adapter.source.rfind(exec_prefix, 0) == 0 || launchers().count(adapter.source) != 0;
    return adapter.source != "bundled" && !process && looks_like_path(adapter.source);
}

void set_bundled_adapters(std::vector<Adapter> adapters) { bundled_list() = std::move(adapters); }

std::vector<Adapter> bundled_adapters() { return bundled_list(); }

std::string python_example_path() {
    const std::filesystem::path wheel = wheel_package_dir();
    if (!wheel.empty()) return (wheel / "examples" / "activation_memory_adapter.py").string();
    return KVCHECK_PYTHON_SDK_DIR "/examples/activation_memory_adapter.py";
}

Adapter python_example(const AdapterOptions& options) { return load_adapter(python_example_path(), options); }

Adapter load_adapter(const std::string& name_or_path, const AdapterOptions& options) {
    if (const Adapter* bundled = find_bundled(name_or_path)) return *bundled;
    std::string why;
    if (const auto command = process_command(name_or_path, options, why)) return load_process_adapter(*command, why);
    if (looks_like_path(name_or_path)) return load_plugin(name_or_path);
    std::string names;
    for (const Adapter& bundled : bundled_list()) names += " " + bundled.name;
    throw UsageError("unknown adapter '" + name_or_path + "': give a bundled name (" + names.substr(1) +
                     "), the path of a plugin (.so), a Python script (.py) or exec:COMMAND");
}

}  // namespace kvcheck::cli
