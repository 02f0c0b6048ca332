/* dlopen and dlclose a library many times (argv[1], default 1000): the dynamic loader's
 * own strlen reads past heap strings (issue 10: 1,040 false errors). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    for (int i = 0; i < n; i++) {
        void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
        void *z = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h || !z) {
            printf("dlopen: %s\n", dlerror());
            return 1;
        }
        double (*cosine)(double) = (double (*)(double))dlsym(h, "cos");
        if (!cosine || cosine(0.0) != 1.0)
            return 2;
        dlclose(z);
        dlclose(h);
    }
    printf("%d\n", n);
    return 0;
}
