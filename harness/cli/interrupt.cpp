#include "interrupt.h"

#include <csignal>

namespace kvcheck::cli {
namespace {

volatile std::sig_atomic_t interrupting_signal = 0;

extern "C" void on_interrupt(int signal) { interrupting_signal = signal; }

}  // namespace

void install_interrupt_handlers() {
    for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
        struct sigaction current {};
        ::sigaction(signal, nullptr, &current);
        if (current.sa_handler == SIG_IGN) continue;
        struct sigaction action {};
        action.sa_handler = on_interrupt;
        sigemptyset(&action.sa_mask);
        // No SA_RESTART: a blocking poll returns at once. SA_RESETHAND: the
        // second signal is not caught.
        action.sa_flags = SA_RESETHAND;
        ::sigaction(signal, &action, nullptr);
    }
}

int interrupted_by() { return interrupting_signal; }


}  // namespace kvcheck::cli
