/*
 * cairn-launcher: starts cell gates for one Cairn process, so that Cairn does not fork itself.
 *
 * Why it exists. Node starts a child with fork(): the whole Node process (tens to hundreds of MB of
 * V8 heap) has its page tables copied, and every page the parent writes afterwards takes a
 * copy-on-write fault. That cost 3.5 ms of the harness's CPU per launch from a 52 MB Node and 6.5 ms
 * from a 317 MB one, the largest single cost of a round. This program is a few hundred KB; its fork
 * costs a small fraction of that, and it is paid here, not on the harness's event loop.
 *
 * What it does, and nothing else. The harness starts one launcher (in its own session, so a
 * terminal's ^C does not reach it) and sends it requests on stdin. For each request it:
 *   1. opens three Unix stream connections to the harness's socket (its path given as argv[1], in a
 *      directory only the harness's user can enter) and writes "<token> <n>\n" on each (n = 0, 1, 2:
 *      the gate's stdin, stdout, stderr): the harness pairs them with the launch by the token, a
 *      random 128-bit value (32 lowercase hex digits) that only it and this process know; a
 *      connection counts only if the listening end is the harness itself, this process's parent
 *      (SO_PEERCRED; see connect_back);
 *   2. forks; the child starts a new session (setsid: its own process group, pgid = pid), resets
 *      every signal to its default and unblocks them all, puts the three connections on fds 0, 1
 *      and 2 and closes every other fd, and changes to the cell's directory. The child is the gate:
 *      it blocks reading "go\n" from its stdin, which the harness writes only once
 *      `execution_started` is durable; then it keeps its stdin connection as fd 3 (the channel the
 *      cell's init reports the exact exit status on, see run_init), puts /dev/null on stdin and
 *      execs the argv
 *      with the environment exactly as sent (PATH searched in that environment, or dash's default
 *      search path without one), as
 *      `/bin/sh -c 'read go; exec "$@" </dev/null'` would, without the cost of starting a shell per
 *      cell. Anything but "go", or end of file: exit 125, nothing run. An exec failure after
 *      release: a line on the cell's stderr, exit 127 (not found) or 126, as sh's. An argv over the
 *      kernel's exec limits (counting the file name PATH resolves to and a #! script's
 *      interpreter) is refused before the gate is reported started (E2BIG);
 *   3. answers "S <token> <pid> <pgid> <starttime>\n" once the gate waits for release (pgid and
 *      starttime, fields 5 and 22 of /proc/<pid>/stat, read here after the gate's setsid: the
 *      gate's identity, so the harness need not read /proc itself; "- -" when that read failed), or
 *      "E <token> <errno> <step>\n" when a step failed (step: connect, fork, setsid, signals, dup2,
 *      chdir, exec or request; the child's own errno and step come back through a close-on-exec
 *      pipe, the usual way);
 *   4. reaps every child that exits and answers "X <pid> <wait status> <empty>\n", where empty is
 *      1 when no process of the child's process group was left at the reap (kill(-pid, 0) said
 *      ESRCH), else 0.
 * This program never writes to a gate and never signals one: releasing, stopping and killing stay
 * with the harness, by process group.
 *
 * When stdin ends (the harness exited or died), the launcher exits at once. Its children are
 * reparented and run on exactly as they would have if the harness had been their parent: a gate not
 * yet released reads end-of-file (its stdin's peer was the harness) and exits 125 without running
 * anything; a released cell is found by the next owner's recovery, as before.
 *
 * Request frame on stdin: a 4-byte little-endian length, then that many bytes of NUL-terminated
 * strings: token, cwd, argument count, the arguments (argv[0] is the program), environment count,
 * the "KEY=value" strings. The harness refuses a NUL inside any string before sending. Every field
 * is checked here too (the token's exact form, counts in decimal digits only and within what the
 * frame can hold): a malformed request is answered "E - <errno> request" and changes nothing.
 *
 * The cell's init: `cairn-launcher init [--pid1] [--nproc N] [--data BYTES] -- PROGRAM ARGS...`.
 * The gate execs it (directly, or as the command of the bubblewrap sandbox) and it runs the cell
 * as its child:
 *   - it applies the fallback limits (RLIMIT_NPROC, RLIMIT_DATA) when the harness could not put the
 *     cell in a cgroup of its own;
 *   - it reports the cell's exact wait status as "X <status>\n" on fd 3 (the gate's stdin
 *     connection, kept for it), since a sandbox's exit code cannot say whether a signal killed it;
 *   - with --pid1 it is the first process of the sandbox's PID namespace: it reaps every orphan,
 *     passes SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to every process of the
 *     namespace (so a stop gives all of them their grace period, `setsid` ones included), and exits
 *     as soon as the cell's main process has: the kernel then kills whatever the cell left behind.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* A request larger than this is refused (answered E ... E2BIG): the kernel's own limit on argv plus
 * environment (ARG_MAX is 2 MiB by default; 32 MiB leaves room for a raised stack limit). */
#define MAX_FRAME (32u * 1024u * 1024u)

static const char *socket_path;

/* A token is exactly this many lowercase hex digits (128 random bits). */
#define TOKEN_LEN 32

/* 1 when s is a well-formed token. */
static int valid_token(const char *s) {
  for (int i = 0; i < TOKEN_LEN; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return s[TOKEN_LEN] == 0;
}

/* A count field: decimal digits only, at most `max`; -1 otherwise. */
static long parse_count(const char *s, long max) {
  if (*s == 0 || strlen(s) > 10) return -1;
  long v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (*p - '0');
  }
  return v <= max ? v : -1;
}

static void die(const char *what) {
  fprintf(stderr, "cairn-launcher: %s: %s\n", what, strerror(errno));
  exit(2);
}

/* Writes all of buf to stdout (the harness), retrying short writes. */
static void answer(const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(1, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      exit(0); /* the harness is gone */
    }
    buf += n;
    len -= (size_t)n;
  }
}

/*
 * The process group and start time (fields 5 and 22 of /proc/<pid>/stat) of a child, into pgid and
 * start (a decimal string of at most cap-1 digits). The command name (field 2) may hold spaces and
 * parentheses: fields are counted after its LAST ')'. Returns 0 on success, -1 otherwise.
 */
static int read_identity(pid_t pid, long *pgid, char *start, size_t cap) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n;
  do n = read(fd, buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (p == NULL) return -1;
  p++;
  /* After ") " come field 3 (state), 4, 5 (pgrp) ... 22 (starttime). */
  for (int field = 3; field <= 22; field++) {
    while (*p == ' ') p++;
    char *end = p;
    while (*end != ' ' && *end != '\0' && *end != '\n') end++;
    if (end == p) return -1;
    if (field == 5) {
      char *stop;
      *pgid = strtol(p, &stop, 10);
      if (stop != end) return -1;
    } else if (field == 22) {
      size_t len = (size_t)(end - p);
      if (len + 1 > cap) return -1;
      for (char *q = p; q < end; q++)
        if (*q < '0' || *q > '9') return -1;
      memcpy(start, p, len);
      start[len] = '\0';
      return 0;
    }
    p = end;
  }
  return -1;
}

/* The steps a launch can fail at, as named in an E answer. */
enum step { STEP_CONNECT, STEP_FORK, STEP_SETSID, STEP_SIGNALS, STEP_DUP2, STEP_CHDIR, STEP_EXEC, STEP_REQUEST };
static const char *const step_names[] = {"connect", "fork", "setsid", "signals", "dup2", "chdir", "exec", "request"};

/* `token` is a checked token, or "-" when the request's own was malformed. */
static void answer_error(const char *token, int err, int step) {
  char line[TOKEN_LEN + 64];
  const char *name = step >= 0 && step <= STEP_REQUEST ? step_names[step] : "unknown";
  int n = snprintf(line, sizeof line, "E %s %d %s\n", token, err, name);
  if (n > 0 && (size_t)n < sizeof line) answer(line, (size_t)n);
}

/* Reads exactly len bytes from stdin; returns 0 at end of input. */
static int read_full(void *buf, size_t len) {
  char *p = buf;
  while (len > 0) {
    ssize_t n = read(0, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("read");
    }
    if (n == 0) return 0;
    p += n;
    len -= (size_t)n;
  }
  return 1;
}

/* The harness: the process that started this launcher, and the only one whose socket it connects to. */
static pid_t harness_pid;

/* Opens one connection to the harness and tags it; returns the fd or -1 with errno set.
 *
 * The socket lives in a directory only the harness's user may enter, but a path can be replaced by
 * whoever can write its directory: a connection counts only when the listening end is the harness
 * itself (SO_PEERCRED gives the pid that called listen()) and the harness is still this process's
 * parent (if it died, no one else may take its launches). Anything else is refused with
 * ECONNREFUSED. `token` was checked to be TOKEN_LEN hex digits. */
static int connect_back(const char *token, int stream) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, socket_path, strlen(socket_path) + 1); /* its length was checked in main */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int connected;
  while ((connected = connect(fd, (struct sockaddr *)&addr, sizeof addr)) < 0 && errno == EINTR) {
  }
  if (connected < 0) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  struct ucred peer;
  socklen_t peer_len = sizeof peer;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) < 0 || peer.pid != harness_pid || getppid() != harness_pid) {
    close(fd); /* a stranger's socket, or the harness is gone */
    errno = ECONNREFUSED;
    return -1;
  }
  char tag[TOKEN_LEN + 8];
  int n = snprintf(tag, sizeof tag, "%s %d\n", token, stream);
  if (n < 0 || (size_t)n >= sizeof tag || write(fd, tag, (size_t)n) != n) {
    int saved = errno == 0 ? EIO : errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

/* In the child, after fork: closes every fd from 3 up but `keep` (the error pipe, close-on-exec), so
 * the cell gets its fds 0, 1 and 2 and nothing else: not even an fd the harness itself inherited
 * without close-on-exec from whoever started it (Node's spawn would pass that on). */
static void close_from_3(int keep) {
#ifdef SYS_close_range
  if ((keep <= 3 || syscall(SYS_close_range, 3u, (unsigned)keep - 1, 0u) == 0) && syscall(SYS_close_range, (unsigned)keep + 1, ~0u, 0u) == 0) return;
#endif
  /* Without close_range (Linux < 5.9): the open fds as listed by /proc (this process is single-threaded). */
  DIR *dir = opendir("/proc/self/fd");
  if (dir == NULL) return;
  int own = dirfd(dir);
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    int fd = atoi(e->d_name);
    if (fd >= 3 && fd != keep && fd != own) close(fd);
  }
  closedir(dir);
}

/* The launcher's own argv area (contiguous strings), reused to show a gate's command line in ps. */
static char *argv_area;
static size_t argv_area_len;

/* In a gate: shows "cairn-gate PROGRAM" as the process's name and command line (ps, /proc). */
static void name_gate(const char *program) {
  prctl(PR_SET_NAME, "cairn-gate", 0, 0, 0);
  if (argv_area == NULL || argv_area_len < 12) return;
  memset(argv_area, 0, argv_area_len);
  memcpy(argv_area, "cairn-gate", 10);
  size_t room = argv_area_len - 12; /* "cairn-gate\0" ... "\0" */
  size_t n = strlen(program);
  memcpy(argv_area + 11, program, n < room ? n : room);
}

/* dash's search path when there is no PATH, which the shell gate used for a cell without one. */
static const char default_path[] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/* The PATH the cell's program is searched on: its environment's, else dash's default. */
static const char *cell_path(char **envp) {
  for (char **e = envp; *e != NULL; e++)
    if (strncmp(*e, "PATH=", 5) == 0) return *e + 5;
  return default_path;
}

/* In a released gate: exec the cell as sh's `exec "$@" </dev/null` would, searched on the cell's
 * PATH (see cell_path); a failure is reported on the cell's stderr with sh's exit codes (127 not
 * found, 126 otherwise). Never returns. */
static void run_released(char **argv, char **envp) {
  /* The release connection stays open as fd 3 (not close-on-exec): the cell's init reports the
   * cell's wait status on it, and closes it for the cell itself. */
  if (dup2(0, 3) < 0) {
    dprintf(2, "cairn-gate: fd 3: %s\n", strerror(errno));
    _exit(126);
  }
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd < 0 || dup2(null_fd, 0) < 0) {
    dprintf(2, "cairn-gate: /dev/null: %s\n", strerror(errno));
    _exit(126);
  }
  if (null_fd != 0) close(null_fd);
  /* execvpe searches this process's own PATH; the cell gets envp exactly as sent. */
  if (setenv("PATH", cell_path(envp), 1) < 0) _exit(126);
  execvpe(argv[0], argv, envp);
  int err = errno;
  dprintf(2, "cairn-gate: %s: %s\n", argv[0], strerror(err));
  _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

/* The file execvpe will run for `name`, searched on `path` as glibc does (an empty entry is the
 * current directory); `name` itself when it holds a slash; NULL when none is found (the exec then
 * fails after release, 127). Relative to the current directory: call after chdir. */
static char *resolve_program(char *name, const char *path) {
  if (strchr(name, '/') != NULL) return name;
  if (*name == 0) return NULL;
  size_t name_len = strlen(name);
  for (const char *p = path;;) {
    const char *colon = strchr(p, ':');
    size_t dir_len = colon != NULL ? (size_t)(colon - p) : strlen(p);
    char *candidate = malloc(dir_len + 1 + name_len + 1);
    if (candidate == NULL) return NULL;
    if (dir_len == 0) {
      memcpy(candidate, name, name_len + 1);
    } else {
      memcpy(candidate, p, dir_len);
      candidate[dir_len] = '/';
      memcpy(candidate + dir_len + 1, name, name_len + 1);
    }
    struct stat st;
    if (access(candidate, X_OK) == 0 && stat(candidate, &st) == 0 && S_ISREG(st.st_mode)) return candidate;
    free(candidate);
    if (colon == NULL) return NULL;
    p = colon + 1;
  }
}

static int over_exec_limits(char **argv, long argc, char **envp, long envc);

/* In a gate, before release: 1 when the harness wrote "go\n", 0 otherwise (anything else, end of
 * file or an error: the harness is gone, or never released it). Reads no further than the newline. */
static int wait_for_go(void) {
  char line[8];
  size_t n = 0;
  for (;;) {
    char c;
    ssize_t r = read(0, &c, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    if (c == '\n') return n == 2 && line[0] == 'g' && line[1] == 'o';
    if (n == sizeof line) return 0;
    line[n++] = c;
  }
}

/* In the child, after fork: never returns. Sets the gate up (a failure's errno and step are reported
 * on err_fd), reports success by closing err_fd, waits for "go" on its stdin, and only then execs
 * argv (see run_released); without "go", exits 125 having run nothing. */
static void become_gate(int fds[3], int err_fd, const char *cwd, char **argv, long argc, char **envp, long envc) {
  int report[2];
  report[1] = STEP_SETSID;
  if (setsid() < 0) goto fail;
  report[1] = STEP_SIGNALS;
  sigset_t none;
  sigemptyset(&none);
  for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL); /* errors for SIGKILL/SIGSTOP are fine */
  if (sigprocmask(SIG_SETMASK, &none, NULL) < 0) goto fail;
  report[1] = STEP_DUP2;
  /* fds[] are >= 3 (0, 1 and 2 are this program's own stdio), so dup2 never clobbers one of them. */
  for (int i = 0; i < 3; i++)
    if (dup2(fds[i], i) < 0) goto fail;
  close_from_3(err_fd);
  report[1] = STEP_CHDIR;
  if (chdir(cwd) < 0) goto fail;
  report[1] = STEP_EXEC;
  if (over_exec_limits(argv, argc, envp, envc)) {
    errno = E2BIG;
    goto fail;
  }
  name_gate(argv[0]);
  close(err_fd); /* started: the launcher answers S now */
  if (!wait_for_go()) _exit(125);
  run_released(argv, envp);
fail:
  report[0] = errno;
  (void)!write(err_fd, report, sizeof report);
  _exit(127);
}

/* The kernel's room for an exec's strings (fs/exec.c): a quarter of the stack limit, at most
 * _STK_LIM / 4 * 3, at least ARG_MAX (32 pages); pointers to every argument and variable come off it. */
static size_t exec_room(void) {
  struct rlimit stack;
  size_t limit = 6u * 1024u * 1024u;
  if (getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY && stack.rlim_cur / 4 < limit) limit = stack.rlim_cur / 4;
  if (limit < 32 * 4096) limit = 32 * 4096;
  return limit;
}

/* The bytes of argv's and envp's strings; 0 when one alone is over MAX_ARG_STRLEN (128 KiB with its NUL). */
static size_t strings_size(char **argv, long argc, char **envp, long envc, int *too_long) {
  const size_t max_arg_strlen = 32 * 4096;
  size_t total = 0;
  *too_long = 0;
  for (long i = 0; i < argc + envc; i++) {
    size_t n = strlen(i < argc ? argv[i] : envp[i - argc]) + 1;
    if (n > max_arg_strlen) *too_long = 1;
    total += n;
  }
  return total;
}

/* The gate execs only after release, too late to refuse an argv the kernel will not take: so the
 * kernel's own limits are checked first, and such a launch is refused as E2BIG before anything
 * starts, as the exec of a shell gate carrying the same argv would have been.
 * Before the fork (a lower bound: the program's name as given): 1 when surely over. */
static int surely_over_exec_limits(char **argv, long argc, char **envp, long envc) {
  int too_long;
  size_t total = strings_size(argv, argc, envp, envc, &too_long) + strlen(argv[0]) + 1;
  size_t pointers = (size_t)(argc + envc) * sizeof(char *);
  size_t room = exec_room();
  return too_long || room <= pointers || total > room - pointers;
}

/* In the gate, after chdir (exact): the kernel also copies the file name execvpe resolves (e.g.
 * /usr/bin/true for true), and for a #! script it drops argv[0] and adds the script's path, the
 * interpreter's optional argument and its name (binfmt_script). 1 when that does not fit. */
static int over_exec_limits(char **argv, long argc, char **envp, long envc) {
  int too_long;
  size_t strings = strings_size(argv, argc, envp, envc, &too_long);
  size_t pointers = (size_t)(argc + envc) * sizeof(char *);
  size_t room = exec_room();
  if (too_long || room <= pointers) return 1;
  room -= pointers;
  char *file = resolve_program(argv[0], cell_path(envp));
  if (file == NULL) return strings + strlen(argv[0]) + 1 > room;
  size_t total = strings + strlen(file) + 1;
  int over = total > room;
  char buf[257];
  int fd = over ? -1 : open(file, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n;
    do n = read(fd, buf, 256);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n >= 2 && buf[0] == '#' && buf[1] == '!') {
      buf[n] = 0;
      char *end = strchr(buf, '\n');
      if (end == NULL) end = buf + n;
      *end = 0;
      char *name = buf + 2;
      while (*name == ' ' || *name == '\t') name++;
      char *arg = name;
      while (*arg != 0 && *arg != ' ' && *arg != '\t') arg++;
      size_t name_len = (size_t)(arg - name);
      while (*arg == ' ' || *arg == '\t') arg++;
      size_t arg_len = strlen(arg);
      while (arg_len > 0 && (arg[arg_len - 1] == ' ' || arg[arg_len - 1] == '\t')) arg_len--;
      if (name_len > 0) {
        size_t script = total - (strlen(argv[0]) + 1) + (strlen(file) + 1) + (arg_len > 0 ? arg_len + 1 : 0) + name_len + 1;
        over = script > room;
      }
    }
  }
  if (file != argv[0]) free(file);
  return over;
}

/* Parses one request and launches it. */
static void launch(char *frame, uint32_t len) {
  /* Split the frame into its NUL-terminated strings. */
  char *end = frame + len;
  char *p = frame;
  char *fields[4] = {0};
  char **argv = NULL;
  char **envp = NULL;
  const char *token = "-";
#define NEXT(dst)                                        \
  do {                                                   \
    char *z = memchr(p, 0, (size_t)(end - p));           \
    if (z == NULL) goto malformed;                       \
    (dst) = p;                                           \
    p = z + 1;                                           \
  } while (0)
  NEXT(fields[0]);
  if (!valid_token(fields[0])) goto malformed;
  token = fields[0];
  NEXT(fields[1]); /* cwd */
  if (fields[1][0] != '/') goto malformed;
  NEXT(fields[2]); /* argc: every argument takes at least its NUL */
  long argc = parse_count(fields[2], (long)(end - p));
  if (argc < 1) goto malformed;
  argv = calloc((size_t)argc + 1, sizeof(char *));
  if (argv == NULL) die("calloc");
  for (long i = 0; i < argc; i++) NEXT(argv[i]);
  NEXT(fields[3]); /* envc */
  long envc = parse_count(fields[3], (long)(end - p));
  if (envc < 0) goto malformed;
  envp = calloc((size_t)envc + 1, sizeof(char *));
  if (envp == NULL) die("calloc");
  for (long i = 0; i < envc; i++) {
    char *z = memchr(p, 0, (size_t)(end - p));
    if (z == NULL) goto malformed;
    envp[i] = p;
    p = z + 1;
  }
  if (p != end) goto malformed; /* bytes after the last string: out of step */
#undef NEXT

  int fds[3] = {-1, -1, -1};
  int err_pipe[2] = {-1, -1};
  int failure = 0;
  int step = STEP_CONNECT;
  if (surely_over_exec_limits(argv, argc, envp, envc)) {
    free(argv);
    free(envp);
    answer_error(token, E2BIG, STEP_EXEC);
    return;
  }
  for (int i = 0; i < 3 && failure == 0; i++) {
    fds[i] = connect_back(token, i);
    if (fds[i] < 0) failure = errno;
  }
  if (failure == 0) step = STEP_FORK;
  if (failure == 0 && pipe2(err_pipe, O_CLOEXEC) < 0) failure = errno;
  pid_t pid = -1;
  if (failure == 0) {
    pid = fork();
    if (pid < 0) failure = errno;
    if (pid == 0) become_gate(fds, err_pipe[1], fields[1], argv, argc, envp, envc);
  }
  for (int i = 0; i < 3; i++)
    if (fds[i] >= 0) close(fds[i]); /* the gate holds them now; the harness must see them close */
  if (pid > 0) {
    close(err_pipe[1]);
    int report[2] = {0, 0};
    ssize_t n;
    do n = read(err_pipe[0], report, sizeof report);
    while (n < 0 && errno == EINTR);
    close(err_pipe[0]);
    if (n == (ssize_t)sizeof report) {
      /* The child failed before or at exec and is exiting: reap it here so no X line is sent. */
      while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
      }
      failure = report[0] != 0 ? report[0] : EIO;
      step = report[1];
    }
  } else if (err_pipe[0] >= 0) {
    close(err_pipe[0]);
    close(err_pipe[1]);
  }
  free(argv);
  free(envp);
  if (failure != 0)
    answer_error(token, failure, step);
  else {
    /* The gate has done setsid (it wrote its report pipe's end shut only after): its pgid is final. */
    long pgid = 0;
    char start[32];
    char line[200];
    int n = read_identity(pid, &pgid, start, sizeof start) == 0
                ? snprintf(line, sizeof line, "S %s %ld %ld %s\n", token, (long)pid, pgid, start)
                : snprintf(line, sizeof line, "S %s %ld - -\n", token, (long)pid);
    if (n > 0) answer(line, (size_t)n);
  }
  return;
malformed:
  free(argv);
  free(envp);
  fprintf(stderr, "cairn-launcher: malformed request refused\n");
  answer_error(token, EINVAL, STEP_REQUEST);
}

/* A size or count option of init: decimal digits, at least 1. */
static int parse_limit(const char *s, rlim_t *out) {
  if (s == NULL || *s == 0 || strlen(s) > 19) return -1;
  rlim_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (rlim_t)(*p - '0');
  }
  if (v == 0) return -1;
  *out = v;
  return 0;
}

/* Lowers a resource limit to `value` (never above the hard limit this process has). */
static int lower_limit(int resource, rlim_t value) {
  struct rlimit now;
  if (getrlimit(resource, &now) < 0) return -1;
  if (now.rlim_max != RLIM_INFINITY && value > now.rlim_max) value = now.rlim_max;
  struct rlimit lim = {value, value};
  return setrlimit(resource, &lim);
}

/* Writes the cell's wait status to the harness (fd 3), once; the harness reads it before fd 3 closes. */
static void report_status(int status_fd, int status) {
  if (status_fd < 0) return;
  char line[32];
  int n = snprintf(line, sizeof line, "X %d\n", status);
  if (n > 0 && (size_t)n < sizeof line) (void)!write(status_fd, line, (size_t)n);
}

/* `cairn-launcher init ...`: see the header. Never returns to main. */
static int run_init(int argc, char **argv) {
  int pid1 = 0;
  rlim_t nproc = 0, data = 0;
  int i = 2;
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      i++;
      break;
    } else if (strcmp(argv[i], "--pid1") == 0) {
      pid1 = 1;
    } else if (strcmp(argv[i], "--nproc") == 0 && i + 1 < argc) {
      if (parse_limit(argv[++i], &nproc) < 0) goto usage;
    } else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc) {
      if (parse_limit(argv[++i], &data) < 0) goto usage;
    } else {
      goto usage;
    }
  }
  if (i >= argc) goto usage;
  char **cell = argv + i;

  prctl(PR_SET_NAME, "cairn-init", 0, 0, 0);
  /* fd 3 is the harness's end when the gate kept it; the cell itself must never inherit it. */
  int status_fd = fcntl(3, F_GETFD) >= 0 ? 3 : -1;
  if (status_fd >= 0 && fcntl(status_fd, F_SETFD, FD_CLOEXEC) < 0) status_fd = -1;
  if (nproc > 0 && lower_limit(RLIMIT_NPROC, nproc) < 0) {
    dprintf(2, "cairn: could not set the process limit: %s\n", strerror(errno));
    return 126;
  }
  if (data > 0 && lower_limit(RLIMIT_DATA, data) < 0) {
    dprintf(2, "cairn: could not set the memory limit: %s\n", strerror(errno));
    return 126;
  }
  /* No core files from a cell killed by a signal (they would land in its workspace). */
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);

  static const int passed_on[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  sigset_t handled, none;
  sigemptyset(&handled);
  sigemptyset(&none);
  sigaddset(&handled, SIGCHLD);
  for (size_t k = 0; k < sizeof passed_on / sizeof passed_on[0]; k++) sigaddset(&handled, passed_on[k]);
  if (sigprocmask(SIG_BLOCK, &handled, NULL) < 0) return 126;
  int sfd = signalfd(-1, &handled, SFD_CLOEXEC);
  if (sfd < 0) return 126;

  pid_t child = fork();
  if (child < 0) {
    dprintf(2, "cairn: fork: %s\n", strerror(errno));
    return 126;
  }
  if (child == 0) {
    close(sfd);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execvp(cell[0], cell);
    int err = errno;
    dprintf(2, "cairn: %s: %s\n", cell[0], strerror(err));
    _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
  }
  for (;;) {
    struct signalfd_siginfo info;
    ssize_t n = read(sfd, &info, sizeof info);
    if (n < 0 && errno == EINTR) continue;
    if (n != (ssize_t)sizeof info) return 126;
    if (info.ssi_signo != SIGCHLD) {
      /* As the namespace's first process, every process in it gets the stop (kill(-1) spares the
       * sender); outside a namespace the signal reached the cell's group already. */
      if (pid1) kill(-1, (int)info.ssi_signo);
      continue;
    }
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      if (pid != child) continue; /* an orphan, reaped */
      report_status(status_fd, status);
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (pid1) return 128 + WTERMSIG(status); /* the first process of a namespace cannot raise one */
      signal(WTERMSIG(status), SIG_DFL);
      sigprocmask(SIG_SETMASK, &none, NULL);
      raise(WTERMSIG(status));
      return 128 + WTERMSIG(status);
    }
  }
usage:
  fprintf(stderr, "usage: cairn-launcher init [--pid1] [--nproc N] [--data BYTES] -- PROGRAM [ARGS...]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "init") == 0) return run_init(argc, argv);
  if (argc != 2 || argv[1][0] != '/' || strlen(argv[1]) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    fprintf(stderr, "usage: cairn-launcher SOCKET-PATH (an absolute path of at most 107 bytes), or cairn-launcher init ...\n");
    return 2;
  }
  socket_path = argv[1];
  harness_pid = getppid();
  /* A cell's processes orphaned by its init's death (a SIGKILL of the group) come back to this
   * process, which reaps them, instead of lingering as zombies where the machine's first process does
   * not reap (containers without an init). */
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  argv_area = argv[0];
  argv_area_len = (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) + 1 - argv[0]);
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0) die("sigprocmask");
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) die("signalfd");
  if (fcntl(0, F_SETFD, FD_CLOEXEC) < 0 || fcntl(1, F_SETFD, FD_CLOEXEC) < 0) die("fcntl");

  char *frame = NULL;
  for (;;) {
    struct pollfd pfd[2] = {{.fd = 0, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    if (poll(pfd, 2, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (pfd[1].revents & POLLIN) {
      struct signalfd_siginfo info;
      while (read(sfd, &info, sizeof info) == (ssize_t)sizeof info) {
      }
      int status;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        /* Whether any process of the gate's group is left, asked now, right after the reap: 1 when
         * none is (ESRCH; zombies count as members), so the harness need not look. Asked later, a
         * new group could hold the pid's number by then. */
        int empty = pid > 1 && kill(-pid, 0) < 0 && errno == ESRCH;
        char line[80];
        int n = snprintf(line, sizeof line, "X %ld %d %d\n", (long)pid, status, empty);
        answer(line, (size_t)n);
      }
    }
    if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      unsigned char hdr[4];
      if (!read_full(hdr, sizeof hdr)) return 0; /* the harness closed its end: done */
      uint32_t len = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
      if (len == 0 || len > MAX_FRAME) {
        fprintf(stderr, "cairn-launcher: request of %u bytes refused; the protocol is out of step, exiting\n", len);
        return 2;
      }
      frame = realloc(frame, len);
      if (frame == NULL) die("realloc");
      if (!read_full(frame, len)) return 0;
      if (frame[len - 1] != 0) {
        fprintf(stderr, "cairn-launcher: request not NUL-terminated; the protocol is out of step, exiting\n");
        return 2;
      }
      launch(frame, len);
    }
  }
}
