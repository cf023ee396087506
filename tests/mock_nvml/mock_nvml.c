/*
 * A stand-in for libnvidia-ml.so.1: the NVML functions the DRA driver calls, with NVML's C
 * signatures and versioned structures, over a node described in a text file.
 *
 * Why C and not a Python fake: nvidia-ml-py's ctypes layer (symbol names, struct layouts,
 * version fields, caller-sized arrays, handles, return codes) only runs against a real shared
 * library. Functions this mock lacks are simply absent, as on an older driver, so nvidia-ml-py
 * answers NVML_ERROR_FUNCTION_NOT_FOUND for them.
 *
 * Environment:
 *   MOCK_NVML_NODE    the node file (written by tests/support/mock_nvml.py; format below). Read at
 *                     every first nvmlInit (reference count 0 -> 1).
 *   MOCK_NVML_STATE   where GPU and compute instances are kept across processes, as a real GPU
 *                     keeps them until reboot. Without it, every first nvmlInit starts from the
 *                     node file's instances.
 *   MOCK_NVML_FAULTS  a directory polled for faults:
 *                       lost-<gpu index>          the GPU has fallen off the bus, for good
 *                       xid-<seq>-<gpu>-<xid>     one XID event, delivered by nvmlEventSetWait_v2
 *                                                 to a set registered for XIDs on that GPU
 *                       fail-<function name>      the next call of that function returns the
 *                                                 NVML return code the file holds (decimal)
 *                       processes                 lines "<gpu> <gi|-1> <ci|-1> <pid> <bytes>"; a device's
 *                                                 memory used is the sum of its processes' bytes
 *                       utilization               lines "<gpu> <percent>": nvmlDeviceGetUtilizationRates
 *                                                 of a whole GPU (0 when the GPU is not listed)
 *                       process-utilization       lines "<gpu> <pid> <SM percent>": the samples
 *                                                 nvmlDeviceGetProcessUtilization returns
 *                       hang-<function name>      calls of that function wait while the file exists,
 *                                                 outside the mock's lock, as a real driver stuck in
 *                                                 one call leaves other threads' calls running; a
 *                                                 call that waits creates hung-<function name> first
 *   MOCK_NVML_CALLS   a file each called function's name is appended to (which calls a test reached)
 *   MOCK_NVML_PROC    a directory standing for /proc, where the kernel side of the driver is
 *                     mimicked: each GPU and compute instance's MIG capability file
 *                     (driver/nvidia/capabilities/gpu<minor>/mig/gi<id>[/ci<id>]/access) exists
 *                     while the instance does, and so do the node-wide mig/config and mig/monitor.
 *
 * Node file: one record per line, fields separated by single spaces, names last.
 *   driver <version string>
 *   cuda <CUDA driver version as NVML's integer, e.g. 13000>
 *   gpu <uuid> <minor> <bus id> <pci device id, hex> <arch> <brand> <cc major> <cc minor>
 *       <memory MiB> <SMs> <mig: 0 unsupported, 1 disabled, 2 enabled> <max GPU instances>
 *       <fabric: - | <cluster uuid as 32 hex digits>:<clique id>> <product name...>
 *   profile <NVML_GPU_INSTANCE_PROFILE_* constant> <id> <slices> <instances> <SMs> <copy engines>
 *       <decoders> <encoders> <jpeg> <ofa> <memory MiB> <placement count> <start> <size> ...
 *   miguuid <gpu instance id> <profile id> <placement start> <MIG UUID>
 *   instance <gpu instance id> <profile id> <placement start>     (exists at boot)
 * profile, miguuid and instance lines belong to the gpu line before them.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_PROFILES 24
#define MAX_PLACEMENTS 16
#define MAX_GI_IDS 16 /* ids 1..15; NVML's are below 16 on every MIG GPU */
#define MAX_CIS 8
#define MAX_MIG_UUIDS 512
#define GI_PROFILE_COUNT 0x12 /* NVML_GPU_INSTANCE_PROFILE_COUNT */
#define CI_PROFILE_COUNT 0x9  /* NVML_COMPUTE_INSTANCE_PROFILE_COUNT */
#define EVENT_XID 0x8ULL
#define SUPPORTED_EVENTS 0x1fULL /* single/double bit ECC, P-state, XID, clock */
#define MIG_UNSUPPORTED 0
#define MIG_DISABLED 1
#define MIG_ENABLED 2
#define NO_ID 0xFFFFFFFFu

/* Versioned structure tags: (version << 24) | sizeof(structure), as nvml.h builds them. */
#define GI_PROFILE_INFO_V2 0x02000098u
#define CI_PROFILE_INFO_V2 0x02000088u
#define MEMORY_V2 0x02000028u
#define FABRIC_INFO_V2 0x02000024u

/* ---- structures as nvml.h lays them out ---------------------------------------------------- */

typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef nvmlGpuInstancePlacement_t nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state; /* an unsigned char in nvml.h, padded to the same offsets */
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

/* ---- the mock's own model ------------------------------------------------------------------- */

typedef struct {
    unsigned int nvml_enum, id, slices, instances, sms, ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mib;
    unsigned int nplacements;
    nvmlGpuInstancePlacement_t placements[MAX_PLACEMENTS];
} profile_t;

/* What every handle points at; `kind` tells them apart, `gpu` is the GPU's index. */
enum { KIND_GPU = 0x6770, KIND_MIG, KIND_GI, KIND_CI };
typedef struct { int kind, gpu, gi, ci; } handle_t;

typedef struct {
    handle_t self;       /* KIND_CI: nvmlComputeInstance_t */
    handle_t mig_device; /* KIND_MIG: the nvmlDevice_t of this MIG device */
    int used;
    unsigned int profile_id; /* == its NVML_COMPUTE_INSTANCE_PROFILE_* constant, as on real drivers */
} compute_instance_t;

typedef struct {
    handle_t self; /* KIND_GI: nvmlGpuInstance_t */
    int used;
    int profile; /* index into the GPU's profiles */
    nvmlGpuInstancePlacement_t placement;
    compute_instance_t cis[MAX_CIS];
} gpu_instance_t;

typedef struct { unsigned int gi, profile_id, start; char uuid[48]; } mig_uuid_t;

typedef struct {
    handle_t self; /* KIND_GPU: nvmlDevice_t */
    char uuid[48], bus_id[32], name[96];
    unsigned int minor, pci_device_id, arch, brand, memory_mib, sms, mig, max_gis;
    int cc_major, cc_minor;
    int has_fabric;
    unsigned char cluster[16];
    unsigned int clique;
    int nprofiles;
    profile_t profiles[MAX_PROFILES];
    int nuuids;
    mig_uuid_t uuids[MAX_MIG_UUIDS];
    int nboot; /* instances at boot */
    unsigned int boot[MAX_GI_IDS][3];
    gpu_instance_t gis[MAX_GI_IDS];
    unsigned int compute_mode; /* nvmlComputeMode_t; kept in the state file, as a GPU keeps it */
} gpu_t;

typedef struct { int magic; unsigned long long types[MAX_GPUS]; } event_set_t;
#define EVENT_SET_MAGIC 0x65766e74

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static char driver_version[80];
static int cuda_version;
static int gpu_count;
static gpu_t gpus[MAX_GPUS];

/* ---- plumbing --------------------------------------------------------------------------------- */

static nvmlReturn_t unlocked(nvmlReturn_t code) {
    pthread_mutex_unlock(&lock);
    return code;
}

static const char *faults_dir(void) {
    const char *dir = getenv("MOCK_NVML_FAULTS");
    return dir && *dir ? dir : NULL;
}

/* The code a fail-<function> file holds, consumed; NVML_SUCCESS when there is none. */
static nvmlReturn_t injected(const char *function) {
    const char *dir = faults_dir();
    if (!dir) return NVML_SUCCESS;
    char path[4096];
    snprintf(path, sizeof path, "%s/fail-%s", dir, function);
    FILE *file = fopen(path, "r");
    if (!file) return NVML_SUCCESS;
    int code = NVML_ERROR_UNKNOWN;
    if (fscanf(file, "%d", &code) != 1) code = NVML_ERROR_UNKNOWN;
    fclose(file);
    unlink(path);
    return code;
}

static int is_lost(int gpu) {
    const char *dir = faults_dir();
    if (!dir) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/lost-%d", dir, gpu);
    return access(path, F_OK) == 0;
}

static void record(const char *function) {
    const char *path = getenv("MOCK_NVML_CALLS");
    if (!path || !*path) return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[128];
    int length = snprintf(line, sizeof line, "%s\n", function);
    if (write(fd, line, (size_t)length) < 0) { /* a lost record only weakens the coverage check */
    }
    close(fd);
}

/* Every public function starts here: the lock, initialization, then an injected failure. */
/* While hang-<function> exists in the fault directory, the call waits (polled every 10 ms); a
 * call that waits first creates hung-<function>, so a test knows a call is stuck. */
static void hang_while_asked(const char *function) {
    const char *dir = faults_dir();
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/hang-%s", dir, function);
    if (access(path, F_OK) != 0) return;
    char hung[4096];
    snprintf(hung, sizeof hung, "%s/hung-%s", dir, function);
    int fd = open(hung, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    struct timespec pause = {0, 10 * 1000 * 1000};
    while (access(path, F_OK) == 0) nanosleep(&pause, NULL);
}

#define ENTER(function)                                          \
    hang_while_asked(function);                                  \
    pthread_mutex_lock(&lock);                                   \
    record(function);                                            \
    if (refcount == 0) return unlocked(NVML_ERROR_UNINITIALIZED); \
    do {                                                         \
        nvmlReturn_t failure_ = injected(function);              \
        if (failure_ != NVML_SUCCESS) return unlocked(failure_); \
    } while (0)

/* A handle is only trusted when it points into the mock's own tables. */
static handle_t *as_handle(const void *pointer, int kind) {
    const char *p = pointer, *low = (const char *)gpus, *high = (const char *)(gpus + MAX_GPUS);
    if (!p || p < low || p >= high) return NULL;
    handle_t *handle = (handle_t *)pointer;
    return handle->kind == kind && handle->gpu >= 0 && handle->gpu < gpu_count ? handle : NULL;
}

/* A whole GPU (or, with allow_mig, a MIG device) from a device handle, with the return code for a
 * bad or lost one. */
static nvmlReturn_t device_of(const void *device, int allow_mig, gpu_t **gpu, handle_t **mig) {
    handle_t *handle = as_handle(device, KIND_GPU);
    handle_t *mig_handle = handle ? NULL : as_handle(device, KIND_MIG);
    if (!handle && !mig_handle) return NVML_ERROR_INVALID_ARGUMENT;
    if (mig_handle && !allow_mig) return NVML_ERROR_NOT_SUPPORTED;
    int index = handle ? handle->gpu : mig_handle->gpu;
    if (is_lost(index)) return NVML_ERROR_GPU_IS_LOST;
    if (mig_handle && !gpus[index].gis[mig_handle->gi].cis[mig_handle->ci].used)
        return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = &gpus[index];
    if (mig) *mig = mig_handle;
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_of(const void *pointer, gpu_t **gpu, gpu_instance_t **gi) {
    handle_t *handle = as_handle(pointer, KIND_GI);
    if (!handle) return NVML_ERROR_INVALID_ARGUMENT;
    if (is_lost(handle->gpu)) return NVML_ERROR_GPU_IS_LOST;
    gpu_instance_t *instance = &gpus[handle->gpu].gis[handle->gi];
    if (!instance->used) return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = &gpus[handle->gpu];
    *gi = instance;
    return NVML_SUCCESS;
}

static nvmlReturn_t ci_of(const void *pointer, gpu_t **gpu, gpu_instance_t **gi, compute_instance_t **ci) {
    handle_t *handle = as_handle(pointer, KIND_CI);
    if (!handle) return NVML_ERROR_INVALID_ARGUMENT;
    if (is_lost(handle->gpu)) return NVML_ERROR_GPU_IS_LOST;
    gpu_instance_t *instance = &gpus[handle->gpu].gis[handle->gi];
    if (!instance->used || !instance->cis[handle->ci].used) return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = &gpus[handle->gpu];
    *gi = instance;
    *ci = &instance->cis[handle->ci];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

static const profile_t *profile_by_id(const gpu_t *gpu, unsigned int id) {
    for (int i = 0; i < gpu->nprofiles; i++)
        if (gpu->profiles[i].id == id) return &gpu->profiles[i];
    return NULL;
}

/* ---- compute instance profiles ------------------------------------------------------------- */

/* Compute slices of each NVML_COMPUTE_INSTANCE_PROFILE_* constant; 0 for the variants (REV1,
 * NVL) no catalog GPU offers. */
static const unsigned int CI_SLICES[CI_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 0, 0};

/* Which compute instance sizes a GPU instance of `slices` offers, as A100/H100 do: its own size,
 * and 1 and 2 slices; a 7-slice one also 3 and 4. */
static int ci_offered(unsigned int ci_slices, unsigned int gi_slices) {
    if (ci_slices == 0 || ci_slices > gi_slices) return 0;
    return ci_slices == gi_slices || ci_slices <= 2 || (gi_slices == 7 && ci_slices <= 4);
}

/* ---- node file and state ------------------------------------------------------------------- */

static void reset_instances(gpu_t *gpu, int index) {
    for (int g = 0; g < MAX_GI_IDS; g++) {
        gpu_instance_t *gi = &gpu->gis[g];
        memset(gi, 0, sizeof *gi);
        gi->self = (handle_t){KIND_GI, index, g, -1};
        for (int c = 0; c < MAX_CIS; c++) {
            gi->cis[c].self = (handle_t){KIND_CI, index, g, c};
            gi->cis[c].mig_device = (handle_t){KIND_MIG, index, g, c};
        }
    }
}

static int profile_index(const gpu_t *gpu, unsigned int id) {
    const profile_t *profile = profile_by_id(gpu, id);
    return profile ? (int)(profile - gpu->profiles) : -1;
}

static void put_instance(gpu_t *gpu, unsigned int gi_id, int profile, unsigned int start, unsigned int size) {
    gpu_instance_t *gi = &gpu->gis[gi_id];
    gi->used = 1;
    gi->profile = profile;
    gi->placement = (nvmlGpuInstancePlacement_t){start, size};
}

static void put_compute_instance(gpu_t *gpu, unsigned int gi_id, unsigned int ci_id, unsigned int profile_id) {
    compute_instance_t *ci = &gpu->gis[gi_id].cis[ci_id];
    ci->used = 1;
    ci->profile_id = profile_id;
}

/* The constant of the compute instance profile spanning a GPU instance of `slices`. */
static unsigned int full_ci_profile(unsigned int slices) {
    for (unsigned int c = 0; c < CI_PROFILE_COUNT; c++)
        if (CI_SLICES[c] == slices) return c;
    return 0;
}

static int load_node(const char *path) {
    FILE *file = fopen(path, "r");
    if (!file) {
        fprintf(stderr, "mock-nvml: cannot open MOCK_NVML_NODE %s: %s\n", path, strerror(errno));
        return -1;
    }
    memset(gpus, 0, sizeof gpus);
    gpu_count = 0;
    strcpy(driver_version, "0.0");
    cuda_version = 0;
    char line[8192];
    int number = 0;
    gpu_t *gpu = NULL;
    while (fgets(line, sizeof line, file)) {
        number++;
        line[strcspn(line, "\n")] = 0;
        int used = 0;
        if (sscanf(line, "driver %79s", driver_version) == 1) continue;
        if (sscanf(line, "cuda %d", &cuda_version) == 1) continue;
        if (strncmp(line, "gpu ", 4) == 0) {
            if (gpu_count == MAX_GPUS) break;
            gpu = &gpus[gpu_count];
            char fabric[64];
            if (sscanf(line, "gpu %47s %u %31s %x %u %u %d %d %u %u %u %u %63s %n", gpu->uuid, &gpu->minor,
                       gpu->bus_id, &gpu->pci_device_id, &gpu->arch, &gpu->brand, &gpu->cc_major,
                       &gpu->cc_minor, &gpu->memory_mib, &gpu->sms, &gpu->mig, &gpu->max_gis, fabric,
                       &used) < 13 || !used)
                goto bad;
            snprintf(gpu->name, sizeof gpu->name, "%s", line + used);
            if (strcmp(fabric, "-") != 0) {
                for (int i = 0; i < 16; i++) {
                    unsigned int byte;
                    if (sscanf(fabric + 2 * i, "%2x", &byte) != 1) goto bad;
                    gpu->cluster[i] = (unsigned char)byte;
                }
                if (fabric[32] != ':' || sscanf(fabric + 33, "%u", &gpu->clique) != 1) goto bad;
                gpu->has_fabric = 1;
            }
            gpu->self = (handle_t){KIND_GPU, gpu_count, -1, -1};
            reset_instances(gpu, gpu_count);
            gpu_count++;
            continue;
        }
        if (!gpu) goto bad;
        if (strncmp(line, "profile ", 8) == 0) {
            if (gpu->nprofiles == MAX_PROFILES) goto bad;
            profile_t *p = &gpu->profiles[gpu->nprofiles];
            if (sscanf(line, "profile %u %u %u %u %u %u %u %u %u %u %llu %u %n", &p->nvml_enum, &p->id,
                       &p->slices, &p->instances, &p->sms, &p->ce, &p->dec, &p->enc, &p->jpeg, &p->ofa,
                       &p->memory_mib, &p->nplacements, &used) < 12 ||
                p->nplacements > MAX_PLACEMENTS)
                goto bad;
            const char *rest = line + used;
            for (unsigned int i = 0; i < p->nplacements; i++) {
                int step = 0;
                if (sscanf(rest, "%u %u %n", &p->placements[i].start, &p->placements[i].size, &step) < 2)
                    goto bad;
                rest += step;
            }
            gpu->nprofiles++;
            continue;
        }
        if (strncmp(line, "miguuid ", 8) == 0) {
            if (gpu->nuuids == MAX_MIG_UUIDS) goto bad;
            mig_uuid_t *u = &gpu->uuids[gpu->nuuids];
            if (sscanf(line, "miguuid %u %u %u %47s", &u->gi, &u->profile_id, &u->start, u->uuid) != 4) goto bad;
            gpu->nuuids++;
            continue;
        }
        if (strncmp(line, "instance ", 9) == 0) {
            unsigned int *b = gpu->boot[gpu->nboot];
            if (gpu->nboot == MAX_GI_IDS ||
                sscanf(line, "instance %u %u %u", &b[0], &b[1], &b[2]) != 3 || b[0] >= MAX_GI_IDS)
                goto bad;
            gpu->nboot++;
            continue;
        }
        if (line[0] == 0 || line[0] == '#') continue;
    bad:
        fprintf(stderr, "mock-nvml: %s line %d is not understood: %s\n", path, number, line);
        fclose(file);
        return -1;
    }
    fclose(file);
    return 0;
}

static void boot_instances(void) {
    for (int g = 0; g < gpu_count; g++) {
        gpu_t *gpu = &gpus[g];
        for (int i = 0; i < gpu->nboot; i++) {
            int profile = profile_index(gpu, gpu->boot[i][1]);
            if (profile < 0) continue;
            const profile_t *p = &gpu->profiles[profile];
            unsigned int size = 0;
            for (unsigned int k = 0; k < p->nplacements; k++)
                if (p->placements[k].start == gpu->boot[i][2]) size = p->placements[k].size;
            put_instance(gpu, gpu->boot[i][0], profile, gpu->boot[i][2], size);
            put_compute_instance(gpu, gpu->boot[i][0], 0, full_ci_profile(p->slices));
        }
    }
}

/* Returns whether a state file was there to load. */
static int load_state(const char *path) {
    FILE *file = fopen(path, "r");
    if (!file) return 0;
    char line[256];
    while (fgets(line, sizeof line, file)) {
        unsigned int g, gi, a, b, c;
        if (sscanf(line, "gi %u %u %u %u %u", &g, &gi, &a, &b, &c) == 5 && g < (unsigned)gpu_count &&
            gi < MAX_GI_IDS) {
            int profile = profile_index(&gpus[g], a);
            if (profile >= 0) put_instance(&gpus[g], gi, profile, b, c);
        } else if (sscanf(line, "ci %u %u %u %u", &g, &gi, &a, &b) == 4 && g < (unsigned)gpu_count &&
                   gi < MAX_GI_IDS && a < MAX_CIS && gpus[g].gis[gi].used) {
            put_compute_instance(&gpus[g], gi, a, b);
        } else if (sscanf(line, "cm %u %u", &g, &a) == 2 && g < (unsigned)gpu_count && a <= 3) {
            gpus[g].compute_mode = a;
        }
    }
    fclose(file);
    return 1;
}

/* ---- MIG capability files (the kernel's side, under MOCK_NVML_PROC) --------------------------- */

static void make_dirs(char *path) {
    for (char *slash = strchr(path + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = 0;
        mkdir(path, 0755);
        *slash = '/';
    }
    mkdir(path, 0755);
}

static void write_capability(const char *directory, unsigned int minor) {
    char path[8400];
    snprintf(path, sizeof path, "%s", directory);
    make_dirs(path);
    snprintf(path, sizeof path, "%s/access", directory);
    FILE *file = fopen(path, "w");
    if (!file) return;
    fprintf(file, "DeviceFileMinor: %u\nDeviceFileMode: 292\n", minor);
    fclose(file);
}

static void remove_capability(const char *directory) {
    char path[8400];
    snprintf(path, sizeof path, "%s/access", directory);
    unlink(path);
    rmdir(directory);
}

/* Capability minors as the mock hands them out: distinct per GPU, GPU instance and compute instance. */
static void sync_capabilities(void) {
    const char *proc = getenv("MOCK_NVML_PROC");
    if (!proc || !*proc) return;
    char base[2048], gi_dir[4096], ci_dir[4200];
    snprintf(base, sizeof base, "%s/driver/nvidia/capabilities/mig", proc);
    make_dirs(base);
    const char *admin[2] = {"config", "monitor"};
    for (int i = 0; i < 2; i++) {
        snprintf(gi_dir, sizeof gi_dir, "%s/%s", base, admin[i]);
        FILE *file = fopen(gi_dir, "w");
        if (file) {
            fprintf(file, "DeviceFileMinor: %d\nDeviceFileMode: 292\n", i + 1);
            fclose(file);
        }
    }
    for (int g = 0; g < gpu_count; g++) {
        if (gpus[g].mig == MIG_UNSUPPORTED) continue;
        for (int i = 1; i < MAX_GI_IDS; i++) {
            gpu_instance_t *gi = &gpus[g].gis[i];
            snprintf(gi_dir, sizeof gi_dir, "%s/driver/nvidia/capabilities/gpu%u/mig/gi%d", proc, gpus[g].minor, i);
            unsigned int minor = 1000u + (unsigned)g * 256u + (unsigned)i * 16u;
            for (int c = 0; c < MAX_CIS; c++) {
                snprintf(ci_dir, sizeof ci_dir, "%s/ci%d", gi_dir, c);
                if (gi->used && gi->cis[c].used) write_capability(ci_dir, minor + 1u + (unsigned)c);
                else if (access(ci_dir, F_OK) == 0) remove_capability(ci_dir);
            }
            if (gi->used) write_capability(gi_dir, minor);
            else if (access(gi_dir, F_OK) == 0) remove_capability(gi_dir);
        }
    }
}

/* Written to a temporary file and renamed, so a process killed mid-write leaves the old state. */
static void save_state(void) {
    sync_capabilities();
    const char *path = getenv("MOCK_NVML_STATE");
    if (!path || !*path) return;
    char temporary[4096];
    snprintf(temporary, sizeof temporary, "%s.%d.tmp", path, (int)getpid());
    FILE *file = fopen(temporary, "w");
    if (!file) return;
    for (int g = 0; g < gpu_count; g++)
        for (int i = 0; i < MAX_GI_IDS; i++) {
            gpu_instance_t *gi = &gpus[g].gis[i];
            if (!gi->used) continue;
            fprintf(file, "gi %d %d %u %u %u\n", g, i, gpus[g].profiles[gi->profile].id, gi->placement.start,
                    gi->placement.size);
            for (int c = 0; c < MAX_CIS; c++)
                if (gi->cis[c].used) fprintf(file, "ci %d %d %d %u\n", g, i, c, gi->cis[c].profile_id);
        }
    for (int g = 0; g < gpu_count; g++)
        if (gpus[g].compute_mode) fprintf(file, "cm %d %u\n", g, gpus[g].compute_mode);
    fflush(file);
    fsync(fileno(file));
    fclose(file);
    rename(temporary, path);
}

/* ---- processes --------------------------------------------------------------------------------- */

/* The processes the fault directory says run on the GPU, optionally only those of one instance
 * (ci < 0: any compute instance of the GPU instance). Returns how many matched; fills up to max. */
static unsigned int processes_on(int gpu, int gi, int ci, nvmlProcessInfo_t *out, unsigned int max) {
    const char *dir = faults_dir();
    if (!dir) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/processes", dir);
    FILE *file = fopen(path, "r");
    if (!file) return 0;
    unsigned int found = 0;
    int g, i, c;
    unsigned int pid;
    unsigned long long bytes;
    while (fscanf(file, "%d %d %d %u %llu", &g, &i, &c, &pid, &bytes) == 5) {
        if (g != gpu || (gi >= 0 && i != gi) || (gi >= 0 && ci >= 0 && c != ci)) continue;
        if (out && found < max)
            out[found] = (nvmlProcessInfo_t){pid, bytes, i < 0 ? NO_ID : (unsigned)i, c < 0 ? NO_ID : (unsigned)c};
        found++;
    }
    fclose(file);
    return found;
}

/* Memory the processes on a GPU (gi < 0) or on one MIG device use, in bytes. */
static unsigned long long process_bytes(int gpu, int gi, int ci) {
    nvmlProcessInfo_t found[256];
    unsigned int count = processes_on(gpu, gi, ci, found, 256);
    unsigned long long bytes = 0;
    for (unsigned int i = 0; i < count && i < 256; i++) bytes += found[i].usedGpuMemory;
    return bytes;
}

/* A number from the first line "<gpu> <value>" of a fault file naming the GPU; `fallback` if none. */
static unsigned int gpu_value(const char *name, int gpu, unsigned int fallback) {
    const char *dir = faults_dir();
    if (!dir) return fallback;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *file = fopen(path, "r");
    if (!file) return fallback;
    int g;
    unsigned int value, result = fallback;
    while (fscanf(file, "%d %u", &g, &value) == 2) {
        if (g == gpu) {
            result = value;
            break;
        }
    }
    fclose(file);
    return result;
}

/* ---- init and system ------------------------------------------------------------------------ */

static nvmlReturn_t init(const char *function) {
    pthread_mutex_lock(&lock);
    record(function);
    if (refcount > 0) {
        refcount++;
        return unlocked(NVML_SUCCESS);
    }
    const char *node = getenv("MOCK_NVML_NODE");
    /* Silent, as a real library is when its kernel driver is not loaded. */
    if (!node || !*node) return unlocked(NVML_ERROR_DRIVER_NOT_LOADED);
    if (load_node(node) != 0) return unlocked(NVML_ERROR_DRIVER_NOT_LOADED);
    const char *state = getenv("MOCK_NVML_STATE");
    if (!(state && *state && load_state(state))) boot_instances();
    sync_capabilities();
    refcount = 1;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlInit_v2(void) { return init("nvmlInit_v2"); }
nvmlReturn_t nvmlInit(void) { return init("nvmlInit"); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init("nvmlInitWithFlags");
}

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    record("nvmlShutdown");
    if (refcount == 0) return unlocked(NVML_ERROR_UNINITIALIZED);
    refcount--;
    return unlocked(NVML_SUCCESS);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    record("nvmlErrorString");
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 19: return "In use by another client";
    case 23: return "Insufficient resources";
    case 25: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER("nvmlSystemGetDriverVersion");
    return unlocked(copy_text(version, length, driver_version));
}

static nvmlReturn_t cuda_driver_version(int *version) {
    if (!version) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *version = cuda_version;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    ENTER("nvmlSystemGetCudaDriverVersion");
    return cuda_driver_version(version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    ENTER("nvmlSystemGetCudaDriverVersion_v2");
    return cuda_driver_version(version);
}

/* ---- devices ---------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER("nvmlDeviceGetCount_v2");
    if (!count) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned)gpu_count;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    ENTER("nvmlDeviceGetHandleByIndex_v2");
    if (!device || index >= (unsigned)gpu_count) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (is_lost((int)index)) return unlocked(NVML_ERROR_GPU_IS_LOST);
    *device = &gpus[index].self;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    ENTER("nvmlDeviceGetHandleByUUID");
    if (!uuid || !device) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    for (int g = 0; g < gpu_count; g++) {
        if (strcmp(gpus[g].uuid, uuid) != 0) continue;
        if (is_lost(g)) return unlocked(NVML_ERROR_GPU_IS_LOST);
        *device = &gpus[g].self;
        return unlocked(NVML_SUCCESS);
    }
    return unlocked(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, void **device) {
    ENTER("nvmlDeviceGetHandleByPciBusId_v2");
    if (!bus_id || !device) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    for (int g = 0; g < gpu_count; g++) {
        if (strcasecmp(gpus[g].bus_id, bus_id) != 0) continue;
        if (is_lost(g)) return unlocked(NVML_ERROR_GPU_IS_LOST);
        *device = &gpus[g].self;
        return unlocked(NVML_SUCCESS);
    }
    return unlocked(NVML_ERROR_NOT_FOUND);
}

#define WHOLE_GPU(function, device)                                  \
    gpu_t *gpu = NULL;                                               \
    ENTER(function);                                                 \
    do {                                                             \
        nvmlReturn_t bad_ = device_of(device, 0, &gpu, NULL);        \
        if (bad_ != NVML_SUCCESS) return unlocked(bad_);             \
    } while (0)

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    WHOLE_GPU("nvmlDeviceGetName", device);
    return unlocked(copy_text(name, length, gpu->name));
}

static const char *mig_uuid(const gpu_t *gpu, const gpu_instance_t *gi, int ci, char *fallback) {
    unsigned int gi_id = (unsigned)(gi - gpu->gis), profile_id = gpu->profiles[gi->profile].id;
    for (int i = 0; ci == 0 && i < gpu->nuuids; i++) {
        const mig_uuid_t *u = &gpu->uuids[i];
        if (u->gi == gi_id && u->profile_id == profile_id && u->start == gi->placement.start) return u->uuid;
    }
    /* Instances the node file has no UUID for (split compute instances): made up, but stable. */
    sprintf(fallback, "MIG-00000000-0000-4000-8000-%04x%04x%04x", (unsigned)(gpu - gpus), gi_id, (unsigned)ci);
    return fallback;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceGetUUID");
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    char fallback[64];
    const char *text = mig ? mig_uuid(gpu, &gpu->gis[mig->gi], mig->ci, fallback) : gpu->uuid;
    return unlocked(copy_text(uuid, length, text));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(void *device, unsigned int *minor) {
    WHOLE_GPU("nvmlDeviceGetMinorNumber", device);
    if (!minor) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *minor = gpu->minor;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    WHOLE_GPU("nvmlDeviceGetPciInfo_v3", device);
    if (!pci) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, slot = 0, function = 0;
    sscanf(gpu->bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function);
    /* NVML prints an 8-digit domain in upper case; the legacy field has room for 4. */
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", domain, bus, slot, function);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain, bus, slot, function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = slot;
    pci->pciDeviceId = gpu->pci_device_id;
    pci->pciSubSystemId = 0x147010de;
    return unlocked(NVML_SUCCESS);
}

/* Memory of a whole GPU, or of the GPU instance a MIG device belongs to. */
static unsigned long long memory_mib_of(const gpu_t *gpu, const handle_t *mig) {
    return mig ? gpu->profiles[gpu->gis[mig->gi].profile].memory_mib : gpu->memory_mib;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceGetMemoryInfo");
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!memory) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total = memory_mib_of(gpu, mig) << 20;
    unsigned long long used = process_bytes((int)(gpu - gpus), mig ? mig->gi : -1, mig ? mig->ci : -1);
    if (used > total) used = total;
    *memory = (nvmlMemory_t){total, total - used, used};
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceGetMemoryInfo_v2");
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!memory) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != MEMORY_V2) return unlocked(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total = memory_mib_of(gpu, mig) << 20;
    unsigned long long used = process_bytes((int)(gpu - gpus), mig ? mig->gi : -1, mig ? mig->ci : -1);
    if (used > total) used = total;
    *memory = (nvmlMemory_v2_t){MEMORY_V2, total, 0, total - used, used};
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetArchitecture(void *device, unsigned int *arch) {
    WHOLE_GPU("nvmlDeviceGetArchitecture", device);
    if (!arch) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *arch = gpu->arch;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    WHOLE_GPU("nvmlDeviceGetCudaComputeCapability", device);
    if (!major || !minor) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *major = gpu->cc_major;
    *minor = gpu->cc_minor;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetBrand(void *device, unsigned int *brand) {
    WHOLE_GPU("nvmlDeviceGetBrand", device);
    if (!brand) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *brand = gpu->brand;
    return unlocked(NVML_SUCCESS);
}

/* NVML documents the attributes for MIG devices; a whole GPU is refused, as many drivers do. */
nvmlReturn_t nvmlDeviceGetAttributes_v2(void *device, nvmlDeviceAttributes_t *attributes) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceGetAttributes_v2");
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!attributes) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    const gpu_instance_t *gi = &gpu->gis[mig->gi];
    const profile_t *p = &gpu->profiles[gi->profile];
    unsigned int slices = CI_SLICES[gi->cis[mig->ci].profile_id];
    *attributes = (nvmlDeviceAttributes_t){p->sms / p->slices * slices, p->ce, p->dec, p->enc, p->jpeg, p->ofa,
                                           p->slices, slices, p->memory_mib};
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned int *current, unsigned int *pending) {
    WHOLE_GPU("nvmlDeviceGetMigMode", device);
    if (!current || !pending) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu->mig == MIG_UNSUPPORTED) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    *current = *pending = gpu->mig == MIG_ENABLED;
    return unlocked(NVML_SUCCESS);
}

/* NVML_COMPUTEMODE_DEFAULT 0 .. NVML_COMPUTEMODE_EXCLUSIVE_PROCESS 3; a whole GPU's setting. */
nvmlReturn_t nvmlDeviceGetComputeMode(void *device, unsigned int *mode) {
    WHOLE_GPU("nvmlDeviceGetComputeMode", device);
    if (!mode) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *mode = gpu->compute_mode;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceSetComputeMode(void *device, unsigned int mode) {
    WHOLE_GPU("nvmlDeviceSetComputeMode", device);
    if (mode > 3) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    gpu->compute_mode = mode;
    save_state();
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *device, unsigned int *is_mig) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceIsMigDeviceHandle");
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!is_mig) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = mig != NULL;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *device, nvmlGpuFabricInfo_v2_t *info) {
    WHOLE_GPU("nvmlDeviceGetGpuFabricInfoV", device);
    if (!info) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != FABRIC_INFO_V2) return unlocked(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (!gpu->has_fabric) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    memset(info, 0, sizeof *info);
    info->version = FABRIC_INFO_V2;
    memcpy(info->clusterUuid, gpu->cluster, 16);
    info->status = NVML_SUCCESS;
    info->cliqueId = gpu->clique;
    info->state = 3; /* NVML_GPU_FABRIC_STATE_COMPLETED */
    return unlocked(NVML_SUCCESS);
}

/* ---- GPU instance profiles and placements --------------------------------------------------- */

static nvmlReturn_t gi_profile(const gpu_t *gpu, unsigned int constant, const profile_t **out) {
    if (gpu->mig == MIG_UNSUPPORTED) return NVML_ERROR_NOT_SUPPORTED;
    if (constant >= GI_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < gpu->nprofiles; i++)
        if (gpu->profiles[i].nvml_enum == constant) {
            *out = &gpu->profiles[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(void *device, unsigned int constant, nvmlGpuInstanceProfileInfo_t *info) {
    WHOLE_GPU("nvmlDeviceGetGpuInstanceProfileInfo", device);
    const profile_t *p = NULL;
    if (!info) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t refused = gi_profile(gpu, constant, &p);
    if (refused != NVML_SUCCESS) return unlocked(refused);
    *info = (nvmlGpuInstanceProfileInfo_t){p->id, 0, p->slices, p->instances, p->sms, p->ce, p->dec, p->enc,
                                           p->jpeg, p->ofa, p->memory_mib};
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(void *device, unsigned int constant, nvmlGpuInstanceProfileInfo_v2_t *info) {
    WHOLE_GPU("nvmlDeviceGetGpuInstanceProfileInfoV", device);
    const profile_t *p = NULL;
    if (!info) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != GI_PROFILE_INFO_V2) return unlocked(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    nvmlReturn_t refused = gi_profile(gpu, constant, &p);
    if (refused != NVML_SUCCESS) return unlocked(refused);
    *info = (nvmlGpuInstanceProfileInfo_v2_t){GI_PROFILE_INFO_V2, p->id, 0, p->slices, p->instances, p->sms,
                                              p->ce, p->dec, p->enc, p->jpeg, p->ofa, p->memory_mib, ""};
    snprintf(info->name, sizeof info->name, "MIG %ug.%llumb", p->slices, p->memory_mib);
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(void *device, unsigned int profile_id,
                                                           nvmlGpuInstancePlacement_t *placements, unsigned int *count) {
    WHOLE_GPU("nvmlDeviceGetGpuInstancePossiblePlacements_v2", device);
    if (gpu->mig == MIG_UNSUPPORTED) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    const profile_t *p = profile_by_id(gpu, profile_id);
    if (!p || !count) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (!placements) {
        *count = p->nplacements;
        return unlocked(NVML_SUCCESS);
    }
    if (*count < p->nplacements) {
        *count = p->nplacements;
        return unlocked(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    memcpy(placements, p->placements, p->nplacements * sizeof *placements);
    *count = p->nplacements;
    return unlocked(NVML_SUCCESS);
}

/* ---- GPU instances ---------------------------------------------------------------------------- */

/* NVML's rules for a new GPU instance: the profile's placements, no overlap, the per-profile and
 * per-GPU instance limits, and the engines and SMs of the full-GPU profile (memory: the GPU's). */
static nvmlReturn_t admission(const gpu_t *gpu, const profile_t *p, nvmlGpuInstancePlacement_t place) {
    int valid = 0;
    for (unsigned int k = 0; k < p->nplacements; k++)
        valid |= p->placements[k].start == place.start && p->placements[k].size == place.size;
    if (!valid) return NVML_ERROR_INVALID_ARGUMENT;
    const profile_t *full = &gpu->profiles[0];
    for (int i = 1; i < gpu->nprofiles; i++)
        if (gpu->profiles[i].slices > full->slices) full = &gpu->profiles[i];
    unsigned long long need[7] = {p->sms, p->ce, p->dec, p->enc, p->jpeg, p->ofa, p->memory_mib};
    const unsigned long long have[7] = {full->sms, full->ce, full->dec, full->enc, full->jpeg, full->ofa, gpu->memory_mib};
    unsigned int same = 0, all = 0;
    for (int i = 0; i < MAX_GI_IDS; i++) {
        const gpu_instance_t *gi = &gpu->gis[i];
        if (!gi->used) continue;
        const profile_t *q = &gpu->profiles[gi->profile];
        unsigned int a = gi->placement.start, b = a + gi->placement.size;
        if (place.start < b && a < place.start + place.size) return NVML_ERROR_INSUFFICIENT_RESOURCES;
        same += q->id == p->id;
        all++;
        const unsigned long long used[7] = {q->sms, q->ce, q->dec, q->enc, q->jpeg, q->ofa, q->memory_mib};
        for (int r = 0; r < 7; r++) need[r] += used[r];
    }
    if (same >= p->instances || all >= gpu->max_gis) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    for (int r = 0; r < 7; r++)
        if (need[r] > have[r]) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(gpu_t *gpu, const profile_t *p, nvmlGpuInstancePlacement_t place, void **out) {
    nvmlReturn_t refused = admission(gpu, p, place);
    if (refused != NVML_SUCCESS) return refused;
    for (int id = 1; id < MAX_GI_IDS; id++) {
        if (gpu->gis[id].used) continue;
        put_instance(gpu, (unsigned)id, (int)(p - gpu->profiles), place.start, place.size);
        save_state();
        *out = &gpu->gis[id].self;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

static nvmlReturn_t mig_gpu(const gpu_t *gpu) {
    return gpu->mig == MIG_ENABLED ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(void *device, unsigned int profile_id,
                                                      const nvmlGpuInstancePlacement_t *placement, void **gi) {
    WHOLE_GPU("nvmlDeviceCreateGpuInstanceWithPlacement", device);
    if (!placement || !gi) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (mig_gpu(gpu) != NVML_SUCCESS) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    const profile_t *p = profile_by_id(gpu, profile_id);
    if (!p) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    return unlocked(create_gi(gpu, p, *placement, gi));
}

nvmlReturn_t nvmlDeviceCreateGpuInstance(void *device, unsigned int profile_id, void **gi) {
    WHOLE_GPU("nvmlDeviceCreateGpuInstance", device);
    if (!gi) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (mig_gpu(gpu) != NVML_SUCCESS) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    const profile_t *p = profile_by_id(gpu, profile_id);
    if (!p) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int k = 0; k < p->nplacements; k++)
        if (create_gi(gpu, p, p->placements[k], gi) == NVML_SUCCESS) return unlocked(NVML_SUCCESS);
    return unlocked(NVML_ERROR_INSUFFICIENT_RESOURCES);
}

nvmlReturn_t nvmlDeviceGetGpuInstances(void *device, unsigned int profile_id, void **instances, unsigned int *count) {
    WHOLE_GPU("nvmlDeviceGetGpuInstances", device);
    if (!instances || !count) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (mig_gpu(gpu) != NVML_SUCCESS) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    const profile_t *p = profile_by_id(gpu, profile_id);
    if (!p) return unlocked(NVML_ERROR_NOT_SUPPORTED); /* nvml.h: "profileId isn't supported" */
    unsigned int found = 0;
    /* The caller's array holds the profile's instance count, which no GPU exceeds. */
    for (int i = 0; i < MAX_GI_IDS && found < p->instances; i++)
        if (gpu->gis[i].used && gpu->profiles[gpu->gis[i].profile].id == profile_id)
            instances[found++] = &gpu->gis[i].self;
    *count = found;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(void *device, unsigned int id, void **gi) {
    WHOLE_GPU("nvmlDeviceGetGpuInstanceById", device);
    if (!gi) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (mig_gpu(gpu) != NVML_SUCCESS) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    if (id >= MAX_GI_IDS) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpu->gis[id].used) return unlocked(NVML_ERROR_NOT_FOUND);
    *gi = &gpu->gis[id].self;
    return unlocked(NVML_SUCCESS);
}

typedef struct {
    void *device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

nvmlReturn_t nvmlGpuInstanceGetInfo(void *gpu_instance, nvmlGpuInstanceInfo_t *info) {
    gpu_t *gpu = NULL;
    gpu_instance_t *gi = NULL;
    ENTER("nvmlGpuInstanceGetInfo");
    nvmlReturn_t bad = gi_of(gpu_instance, &gpu, &gi);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!info) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *info = (nvmlGpuInstanceInfo_t){&gpu->self, (unsigned)(gi - gpu->gis), gpu->profiles[gi->profile].id, gi->placement};
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceDestroy(void *gpu_instance) {
    gpu_t *gpu = NULL;
    gpu_instance_t *gi = NULL;
    ENTER("nvmlGpuInstanceDestroy");
    nvmlReturn_t bad = gi_of(gpu_instance, &gpu, &gi);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    for (int c = 0; c < MAX_CIS; c++)
        if (gi->cis[c].used) return unlocked(NVML_ERROR_IN_USE);
    if (processes_on((int)(gpu - gpus), (int)(gi - gpu->gis), -1, NULL, 0)) return unlocked(NVML_ERROR_IN_USE);
    gi->used = 0;
    save_state();
    return unlocked(NVML_SUCCESS);
}

/* ---- compute instances ------------------------------------------------------------------------ */

/* The v1 structure is the v2 one without its version and name. */
static nvmlReturn_t ci_profile_info(const char *function, void *gpu_instance, unsigned int constant, unsigned int engines,
                                    nvmlComputeInstanceProfileInfo_v2_t *info, int versioned) {
    gpu_t *gpu = NULL;
    gpu_instance_t *gi = NULL;
    ENTER(function);
    nvmlReturn_t bad = gi_of(gpu_instance, &gpu, &gi);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!info || constant >= CI_PROFILE_COUNT || engines != 0) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (versioned && info->version != CI_PROFILE_INFO_V2) return unlocked(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    const profile_t *p = &gpu->profiles[gi->profile];
    unsigned int slices = CI_SLICES[constant];
    if (!ci_offered(slices, p->slices)) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    *info = (nvmlComputeInstanceProfileInfo_v2_t){CI_PROFILE_INFO_V2, constant, slices, p->slices / slices,
                                                  p->sms / p->slices * slices, p->ce, p->dec, p->enc, p->jpeg, p->ofa, ""};
    snprintf(info->name, sizeof info->name, "MIG %uc.%ug.%llumb", slices, p->slices, p->memory_mib);
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(void *gpu_instance, unsigned int constant, unsigned int engines,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    return ci_profile_info("nvmlGpuInstanceGetComputeInstanceProfileInfoV", gpu_instance, constant, engines, info, 1);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(void *gpu_instance, unsigned int constant, unsigned int engines,
                                                          unsigned int *info_v1) {
    nvmlComputeInstanceProfileInfo_v2_t info;
    nvmlReturn_t result = ci_profile_info("nvmlGpuInstanceGetComputeInstanceProfileInfo", gpu_instance, constant,
                                          engines, info_v1 ? &info : NULL, 0);
    if (result == NVML_SUCCESS) memcpy(info_v1, &info.id, 9 * sizeof(unsigned int));
    return result;
}

nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(void *gpu_instance, unsigned int profile_id, void **out) {
    gpu_t *gpu = NULL;
    gpu_instance_t *gi = NULL;
    ENTER("nvmlGpuInstanceCreateComputeInstance");
    nvmlReturn_t bad = gi_of(gpu_instance, &gpu, &gi);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    const profile_t *p = &gpu->profiles[gi->profile];
    if (!out || profile_id >= CI_PROFILE_COUNT) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (!ci_offered(CI_SLICES[profile_id], p->slices)) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    unsigned int used = 0, same = 0;
    int free_id = -1;
    for (int c = 0; c < MAX_CIS; c++) {
        if (!gi->cis[c].used) {
            if (free_id < 0) free_id = c;
            continue;
        }
        used += CI_SLICES[gi->cis[c].profile_id];
        same += gi->cis[c].profile_id == profile_id;
    }
    unsigned int slices = CI_SLICES[profile_id];
    if (free_id < 0 || used + slices > p->slices || same >= p->slices / slices)
        return unlocked(NVML_ERROR_INSUFFICIENT_RESOURCES);
    put_compute_instance(gpu, (unsigned)(gi - gpu->gis), (unsigned)free_id, profile_id);
    save_state();
    *out = &gi->cis[free_id].self;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(void *gpu_instance, unsigned int profile_id, void **instances,
                                                unsigned int *count) {
    gpu_t *gpu = NULL;
    gpu_instance_t *gi = NULL;
    ENTER("nvmlGpuInstanceGetComputeInstances");
    nvmlReturn_t bad = gi_of(gpu_instance, &gpu, &gi);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    const profile_t *p = &gpu->profiles[gi->profile];
    if (!instances || !count || profile_id >= CI_PROFILE_COUNT) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (!ci_offered(CI_SLICES[profile_id], p->slices)) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    unsigned int found = 0, capacity = p->slices / CI_SLICES[profile_id];
    for (int c = 0; c < MAX_CIS && found < capacity; c++)
        if (gi->cis[c].used && gi->cis[c].profile_id == profile_id) instances[found++] = &gi->cis[c].self;
    *count = found;
    return unlocked(NVML_SUCCESS);
}

typedef struct {
    void *device;
    void *gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(void *compute_instance, nvmlComputeInstanceInfo_t *info) {
    gpu_t *gpu = NULL;
    gpu_instance_t *gi = NULL;
    compute_instance_t *ci = NULL;
    ENTER("nvmlComputeInstanceGetInfo_v2");
    nvmlReturn_t bad = ci_of(compute_instance, &gpu, &gi, &ci);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!info) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int start = 0;
    for (compute_instance_t *before = gi->cis; before < ci; before++)
        if (before->used) start += CI_SLICES[before->profile_id];
    *info = (nvmlComputeInstanceInfo_t){&gpu->self, &gi->self, (unsigned)(ci - gi->cis), ci->profile_id,
                                        {start, CI_SLICES[ci->profile_id]}};
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlComputeInstanceDestroy(void *compute_instance) {
    gpu_t *gpu = NULL;
    gpu_instance_t *gi = NULL;
    compute_instance_t *ci = NULL;
    ENTER("nvmlComputeInstanceDestroy");
    nvmlReturn_t bad = ci_of(compute_instance, &gpu, &gi, &ci);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (processes_on((int)(gpu - gpus), (int)(gi - gpu->gis), (int)(ci - gi->cis), NULL, 0))
        return unlocked(NVML_ERROR_IN_USE);
    ci->used = 0;
    save_state();
    return unlocked(NVML_SUCCESS);
}

/* ---- MIG devices ------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned int *count) {
    WHOLE_GPU("nvmlDeviceGetMaxMigDeviceCount", device);
    if (!count) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (gpu->mig == MIG_UNSUPPORTED) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    *count = gpu->mig == MIG_ENABLED ? gpu->max_gis : 0;
    return unlocked(NVML_SUCCESS);
}

/* MIG devices are numbered in (GPU instance id, compute instance id) order. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned int index, void **mig) {
    WHOLE_GPU("nvmlDeviceGetMigDeviceHandleByIndex", device);
    if (!mig) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (mig_gpu(gpu) != NVML_SUCCESS) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    if (index >= gpu->max_gis) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int seen = 0;
    for (int i = 0; i < MAX_GI_IDS; i++)
        for (int c = 0; gpu->gis[i].used && c < MAX_CIS; c++) {
            if (!gpu->gis[i].cis[c].used) continue;
            if (seen++ == index) {
                *mig = &gpu->gis[i].cis[c].mig_device;
                return unlocked(NVML_SUCCESS);
            }
        }
    return unlocked(NVML_ERROR_NOT_FOUND);
}

static nvmlReturn_t mig_ids(const char *function, void *device, unsigned int *gi_id, unsigned int *ci_id) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER(function);
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!mig) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    if (gi_id) *gi_id = (unsigned)mig->gi;
    if (ci_id) *ci_id = (unsigned)mig->ci;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *device, unsigned int *id) {
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    return mig_ids("nvmlDeviceGetGpuInstanceId", device, id, NULL);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *device, unsigned int *id) {
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    return mig_ids("nvmlDeviceGetComputeInstanceId", device, NULL, id);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *mig_device, void **device) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    nvmlReturn_t bad = device_of(mig_device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!mig || !device) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *device = &gpu->self;
    return unlocked(NVML_SUCCESS);
}

/* ---- processes -------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, nvmlProcessInfo_t *infos) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceGetComputeRunningProcesses_v3");
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (!count) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    int index = (int)(gpu - gpus);
    unsigned int found = processes_on(index, mig ? mig->gi : -1, mig ? mig->ci : -1, NULL, 0);
    if (!infos || *count < found) {
        *count = found;
        return unlocked(found ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    *count = processes_on(index, mig ? mig->gi : -1, mig ? mig->ci : -1, infos, *count);
    return unlocked(NVML_SUCCESS);
}

/* ---- utilisation ------------------------------------------------------------------------------ */

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *utilization) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceGetUtilizationRates");
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (mig) return unlocked(NVML_ERROR_NOT_SUPPORTED); /* as on real MIG devices */
    if (!utilization) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *utilization = (nvmlUtilization_t){gpu_value("utilization", (int)(gpu - gpus), 0), 0};
    return unlocked(NVML_SUCCESS);
}

/* Samples newer than `since` (microseconds); NOT_FOUND when there are none, as NVML answers. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(void *device, nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long since) {
    gpu_t *gpu = NULL;
    handle_t *mig = NULL;
    ENTER("nvmlDeviceGetProcessUtilization");
    nvmlReturn_t bad = device_of(device, 1, &gpu, &mig);
    if (bad != NVML_SUCCESS) return unlocked(bad);
    if (mig) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    if (!count) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    struct timespec now_ts;
    clock_gettime(CLOCK_REALTIME, &now_ts);
    unsigned long long now = (unsigned long long)now_ts.tv_sec * 1000000ULL + (unsigned long long)now_ts.tv_nsec / 1000;
    unsigned int found = 0;
    const char *dir = faults_dir();
    char path[4096];
    FILE *file = NULL;
    if (dir && now > since) {
        snprintf(path, sizeof path, "%s/process-utilization", dir);
        file = fopen(path, "r");
    }
    if (file) {
        int g;
        unsigned int pid, sm;
        while (fscanf(file, "%d %u %u", &g, &pid, &sm) == 3) {
            if (g != (int)(gpu - gpus)) continue;
            if (samples && found < *count)
                samples[found] = (nvmlProcessUtilizationSample_t){pid, now, sm, 0, 0, 0};
            found++;
        }
        fclose(file);
    }
    if (found == 0) return unlocked(NVML_ERROR_NOT_FOUND);
    if (!samples || *count < found) {
        *count = found;
        return unlocked(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    *count = found;
    return unlocked(NVML_SUCCESS);
}

/* ---- events ----------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    WHOLE_GPU("nvmlDeviceGetSupportedEventTypes", device);
    if (!types) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    *types = SUPPORTED_EVENTS;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetCreate(void **set) {
    ENTER("nvmlEventSetCreate");
    if (!set) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    event_set_t *made = calloc(1, sizeof *made);
    if (!made) return unlocked(NVML_ERROR_UNKNOWN);
    made->magic = EVENT_SET_MAGIC;
    *set = made;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    WHOLE_GPU("nvmlDeviceRegisterEvents", device);
    event_set_t *events = set;
    if (!events || events->magic != EVENT_SET_MAGIC) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~SUPPORTED_EVENTS) return unlocked(NVML_ERROR_NOT_SUPPORTED);
    events->types[gpu - gpus] |= types;
    return unlocked(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetFree(void *set) {
    ENTER("nvmlEventSetFree");
    event_set_t *events = set;
    if (!events || events->magic != EVENT_SET_MAGIC) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
    events->magic = 0;
    free(events);
    return unlocked(NVML_SUCCESS);
}

typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* Takes the oldest XID file for a GPU the set watches: renaming it away is the claim, so two
 * waiters (in two processes) never deliver the same event. */
static int take_xid(event_set_t *events, nvmlEventData_t *data) {
    const char *dir = faults_dir();
    if (!dir) return 0;
    DIR *listing = opendir(dir);
    if (!listing) return 0;
    char oldest[256] = "";
    int gpu = -1;
    unsigned long long xid = 0;
    struct dirent *entry;
    while ((entry = readdir(listing))) {
        int g;
        unsigned long long x;
        char seq[64];
        if (sscanf(entry->d_name, "xid-%63[0-9]-%d-%llu", seq, &g, &x) != 3) continue;
        if (g < 0 || g >= gpu_count || !(events->types[g] & EVENT_XID)) continue;
        if (oldest[0] && strcmp(entry->d_name, oldest) >= 0) continue;
        snprintf(oldest, sizeof oldest, "%s", entry->d_name);
        gpu = g;
        xid = x;
    }
    closedir(listing);
    if (gpu < 0) return 0;
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", dir, oldest);
    snprintf(to, sizeof to, "%s/.taken-%d-%s", dir, (int)getpid(), oldest);
    if (rename(from, to) != 0) return 0;
    unlink(to);
    *data = (nvmlEventData_t){&gpus[gpu].self, EVENT_XID, xid, NO_ID, NO_ID};
    return 1;
}

nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        ENTER("nvmlEventSetWait_v2");
        event_set_t *events = set;
        if (!events || events->magic != EVENT_SET_MAGIC || !data) return unlocked(NVML_ERROR_INVALID_ARGUMENT);
        int taken = take_xid(events, data);
        pthread_mutex_unlock(&lock);
        if (taken) return NVML_SUCCESS;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (waited >= timeout_ms) return NVML_ERROR_TIMEOUT;
        struct timespec pause = {0, 10 * 1000000};
        nanosleep(&pause, NULL);
    }
}
