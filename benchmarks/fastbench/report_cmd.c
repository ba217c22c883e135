/* fastbench report RUN.json --out DIR: the HTML page and charts of a run.
 *
 * The document is checked here first (the same checks as compare), so a
 * corrupt or foreign file is reported even where Python is missing. The
 * page is drawn by benchmarks/report/fastbench_report.py (matplotlib), found
 * through FASTPATH_REPORT_SCRIPT, else the source tree's copy, else the
 * installed one; the interpreter is FASTPATH_PYTHON, else python3. It runs
 * without a shell (fork + execvp), so any path is passed as it is, and its
 * exit status is the command's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fastbench.h"

static void report_usage(void) {
    fprintf(stderr, "usage: fastbench report RUN.json --out DIR   (HTML page + roofline and speedup charts)\n");
}

static const char *report_script(void) {
    const char *env = getenv("FASTPATH_REPORT_SCRIPT");
    if (env && *env) return env;
#ifdef FB_SOURCE_DIR
    static const char src[] = FB_SOURCE_DIR "/benchmarks/report/fastbench_report.py";
    if (access(src, R_OK) == 0) return src;
#endif
#ifdef FB_REPORT_SCRIPT
    if (access(FB_REPORT_SCRIPT, R_OK) == 0) return FB_REPORT_SCRIPT;
#endif
    return NULL;
}

/* Runs argv[0] (looked up in PATH) and returns its exit status; 2, with a
 * message, when it cannot be started or dies of a signal. A close-on-exec
 * pipe carries a failed execvp's errno back to the parent. */
static int run_child(char *const *argv) {
    int fds[2];
    if (pipe(fds) != 0) {
        fprintf(stderr, "fastbench report: pipe: %s\n", strerror(errno));
        return 2;
    }
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "fastbench report: fork: %s\n", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return 2;
    }
    if (pid == 0) {
        close(fds[0]);
        execvp(argv[0], argv);
        int err = errno;
        ssize_t w = write(fds[1], &err, sizeof err);
        (void)w;
        _exit(127);
    }
    close(fds[1]);
    int child_errno = 0;
    ssize_t got;
    do got = read(fds[0], &child_errno, sizeof child_errno);
    while (got < 0 && errno == EINTR);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "fastbench report: waitpid: %s\n", strerror(errno));
            return 2;
        }
    }
    if (got == (ssize_t)sizeof child_errno) {
        fprintf(stderr, "fastbench report: cannot run %s: %s (set FASTPATH_PYTHON)\n", argv[0],
                strerror(child_errno));
        return 2;
    }
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    fprintf(stderr, "fastbench report: %s was killed by signal %d\n", argv[0],
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return 2;
}

int fb_cmd_report(int argc, char **argv) {
    const char *run_json = NULL, *out_dir = NULL;
    for (int i = 0; i < argc; ++i) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc && !out_dir) {
            out_dir = argv[++i];
        } else if (argv[i][0] != '-' && !run_json) {
            run_json = argv[i];
        } else {
            report_usage();
            return 2;
        }
    }
    if (!run_json || !out_dir) {
        report_usage();
        return 2;
    }
    cJSON *doc = fb_load_json("report", run_json, stderr);
    if (!doc) return 2;
    cJSON_Delete(doc);
    const char *script = report_script();
    if (!script) {
        fprintf(stderr, "fastbench report: fastbench_report.py not found: set FASTPATH_REPORT_SCRIPT\n");
        return 2;
    }
    const char *python = getenv("FASTPATH_PYTHON");
    if (!python || !*python) python = "python3";
    /* --out=DIR and "--" before the file: neither may be taken for an option */
    size_t n = strlen(out_dir) + sizeof "--out=";
    char *out_arg = malloc(n);
    if (!out_arg) {
        fprintf(stderr, "fastbench report: out of memory\n");
        return 2;
    }
    snprintf(out_arg, n, "--out=%s", out_dir);
    char dashes[] = "--";
    char *child_argv[] = {(char *)python, (char *)script, out_arg, dashes, (char *)run_json, NULL};
    int rc = run_child(child_argv);
    free(out_arg);
    return rc;
}
