/*
 * rekindle_stages.h - stage-based progress recovery (included by rekindle.h).
 */
#ifndef REKINDLE_STAGES_H
#define REKINDLE_STAGES_H
#endif /* REKINDLE_STAGES_H */
