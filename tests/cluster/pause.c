/*
 * The pod sandbox's first process, for the test cluster's pause image (tests/cluster/images.py):
 * it only has to exist, so that the pod's namespaces outlive its containers, and to reap the
 * zombies of processes whose parents died first (it is PID 1 of the pod when the pod shares its
 * PID namespace). Static, so the image needs no libc. SIGTERM or SIGINT ends it with status 0,
 * a clean stop rather than a crash, for a runtime that asks before it kills.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * Exiting inside the handler, rather than setting a flag for the loop to test, leaves no window
 * in which a SIGTERM arriving between the test and pause() would be slept through.
 */
static void stop(int signal_number)
{
    (void)signal_number;
    _exit(0);
}

static void reap(int signal_number)
{
    int saved_errno = errno;

    (void)signal_number;
    /* One SIGCHLD may stand for several children: collect every one that has exited. */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved_errno;
}

static int handle(int signal_number, void (*handler)(int), int flags)
{
    struct sigaction action = {0};

    action.sa_handler = handler;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    return sigaction(signal_number, &action, NULL);
}

int main(void)
{
    if (handle(SIGTERM, stop, 0) != 0 || handle(SIGINT, stop, 0) != 0 ||
        handle(SIGCHLD, reap, SA_NOCLDSTOP | SA_RESTART) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    /* Children it inherited (exec'd by a process that had some) may have exited before the
       handler was installed: their SIGCHLD went to no one. */
    reap(SIGCHLD);
    for (;;) {
        pause();
    }
}
