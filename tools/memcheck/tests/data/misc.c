#include <stdlib.h>
#include <string.h>
#include <malloc.h>
static char g[16];
struct node { struct node *next; char pad[8]; };
void *keep_len64; void *keep_arr;
int main(void){
  char *a = malloc(10);
  free(a + 4);            /* interior */
  free(a);
  a = realloc(a, 20);     /* realloc of freed */
  free(g);                /* global */
  void *c = calloc((size_t)-2, 4);
  void *m = memalign(3, 16);
  /* cycle lost */
  struct node *x = malloc(sizeof *x), *y = malloc(sizeof *y);
  x->next = y; y->next = x;
  /* length64 */
  unsigned long *l = malloc(8 + 40); l[0] = 40; keep_len64 = (char*)l + 8;
  /* newarray */
  unsigned long *n = malloc(8 + 30); n[0] = 3; keep_arr = (char*)n + 8;
  /* chain */
  void **p1 = malloc(16); p1[0] = malloc(16); ((void**)p1[0])[0] = malloc(7);
  p1 = 0;
  return 0;
}
